"""The write side of shadow verification, used by both engines: the engine-agnostic ShadowRecord, the
crash-safe spool writer and the non-blocking tee. The checker (the `shadow` package) reads the spool."""
