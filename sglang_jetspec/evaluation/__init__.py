"""Measurements on the reference engine: `jetspec generate` (the main job), `bench` (the speedup grid),
`replay` (accept lengths without verify passes), `gap` (the branch gap), and their reports."""
