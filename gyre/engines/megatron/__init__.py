"""The Megatron-core train engine (`pip install gyre-rl[megatron]`): `train.py` the engine,
`bootstrap.py` process groups, CPU patches and the model build, `convert.py` HF <-> Megatron
weights, `pipeline.py` pipeline parallelism. megatron-core is imported only in this folder.
"""
