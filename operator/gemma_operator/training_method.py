"""What a row of a batch costs under each training method, as a table: the HBM fit, the remat
choice and the run estimate read it, so a preference pair is priced alike everywhere.

A preference row (dpo, orpo) is a pair, prompt + chosen and prompt + rejected: two sequences of up
to maxSeqLen, so twice an sft row's activations, logits and tokens. DPO also scores both with its
reference, the base model (the adapter off), in a forward pass without gradient each step: about 2N
FLOPs a token beside training's 6N, and one layer's working set at a time, since nothing is kept
for a backward pass. ORPO has no reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma_operator.model_shapes import ModelShape


@dataclass(frozen=True)
class MethodCost:
    sequences_per_row: int  # 2 for a chosen/rejected pair
    reference_forward: bool  # a forward pass of the frozen base model over every sequence

    def flops_per_token(self, shape: ModelShape) -> float:
        """FLOPs per token of every sequence: training's, plus the reference's forward pass."""
        return shape.flops_per_token() + (shape.forward_flops_per_token() if self.reference_forward else 0.0)

    def rows(self, n: int) -> str:
        """n rows in words: `1`, or `1 pair (2 sequences)`."""
        if self.sequences_per_row == 1:
            return str(n)
        return f"{n} pair{'s' if n != 1 else ''} ({n * self.sequences_per_row} sequences)"


METHOD_COST: dict[str, MethodCost] = {
    "sft": MethodCost(sequences_per_row=1, reference_forward=False),
    "dpo": MethodCost(sequences_per_row=2, reference_forward=True),
    "orpo": MethodCost(sequences_per_row=2, reference_forward=False),
}
