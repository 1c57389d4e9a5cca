"""The merge program (`merger.py`) and what only it imports: the reader of the LoRA checkpoint
training wrote, the mapping of LoRA factors onto Hugging Face tensors, the shard pipeline and the
output folder. Nothing outside this package imports it but the runner and the pre-flight check
(which reads the checkpoint's settings); it never imports `training`."""
