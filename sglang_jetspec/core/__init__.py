"""Engine-agnostic JetSpec core: pure PyTorch, never imports SGLang (tested on CPU)."""
