"""Model directories the engines load: any local HF causal LM (`hf.py`), a GGUF file converted
once (`gguf.py`), a model shipped in a Python package (`packaged.py`, e.g. SmolLM2 in
`smollm2.py`), and the bundled tiny model (`tiny.py`).
"""
