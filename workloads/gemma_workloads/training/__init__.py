"""The fine-tuning program (`trainer.py`) and what only it imports: batches and the data feed,
LoRA, the loss, the mesh, the base model's loading, progress and FLOPs, preemption and the
checkpoints it writes. Nothing outside this package imports it but the runner; it never imports
`merging`. Shared with the merge: the contract, the dataset reader, the model folder's checks."""
