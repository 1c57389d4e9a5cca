"""The evaluation after the last training step: the fine-tuned model and the base model scored on
the same rows, so every figure comes with its baseline (config.EVAL_METRICS names them).

- `evalLoss`: the training loss itself (loss.token_weighted_nll over the rows laid out as
  training's held-out batches), so the mean over every answer token; `perplexity` = exp(evalLoss).
- `exactMatch`, `contains`, `regexMatch`: greedy answers (greedy.py, with a KV cache) to the rows
  that have an expected answer or pattern (rows.py), scored by scores.py.
- `preferenceAccuracy`, `rewardMargin` (preference rows): the share of pairs whose chosen answer has
  the higher summed log-probability, and the mean margin log p(chosen) - log p(rejected) in nats;
  for the base model too, so the fine-tune's gain is the difference.

The base model is the same model with every LoRA B factor zeroed (lora.adapter_off), so its
programs are the ones already compiled. LoRA dropout is off throughout (lora.dropout_off). A figure
that is not finite fails the run (exit 1, the message naming the metric), the checkpoint kept.
The package imports nothing heavy: preflight reads rows.py's checks before JAX is loaded.
Each row's answers go to `<output_dir>/evaluation/predictions.jsonl`, the figures to
`<output_dir>/evaluation/metrics.json`.
"""
