"""What runs in the workload pods: `runner.py` (`python -m gemma_workloads train|merge`), the
`training` and `merging` programs, and what both use: the contract with the operator
(`config.py`), the pre-flight checks, model sources, the model folder and safetensors, the dataset
reader, input-file errors, and the tiny test model."""
