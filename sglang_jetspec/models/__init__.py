"""Target models the project can fetch and convert offline."""
