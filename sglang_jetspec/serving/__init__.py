"""The reference engine served over HTTP: the server (SGLang's /generate subset, /metrics, policy push and
readback), its engine thread, the request codec, the shadow hook, and `jetspec serve`'s run."""
