"""Masked-LM training of the encoder on the corpus blocks: BERT's own pre-training objective, the stage REALM starts
from.

    openrealm train mlm --corpus DIR --init MODEL --output DIR --max-steps N [options]

REALM's encoder starts from BERT, whose masked-LM head already fills a [MASK] from context; pre-training then teaches
it to fill from a retrieved block too, and that is the retriever's only signal (retrieval utility). A checkpoint
without a trained MLM head (a sentence-transformers model such as all-MiniLM-L6-v2, whose `cls.predictions.*` are
absent) gives REALM a reader that cannot fill any mask, and the retriever learns from noise
(benchmarks/research/table2_real_wikipedia_gpu.md). This stage trains the head, and the encoder under it, with BERT's
recipe on the corpus's own blocks: `[CLS] title [SEP] body [SEP]`, 15% of the wordpieces chosen, 80% of those
replaced by [MASK], 10% by a random wordpiece, 10% kept (transformers' DataCollatorForLanguageModeling). The loss
and the logits are computed at the chosen positions only (a 30,522-word vocabulary at every position would cost as
much as the encoder).

Before and after training, the loss and accuracy on the same `--eval-blocks` blocks, masked once with a fixed seed,
go to OUTPUT/mlm_training.json. The result is a RealmKnowledgeAugEncoder folder for `openrealm train pretrain
--encoder OUTPUT` (and, through pre-training, the reader of RealmForOpenQA).
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from transformers.utils import ModelOutput

from openrealm import RealmKnowledgeAugEncoder
from openrealm.tokenization.retriever_inputs import block_retriever_inputs
from openrealm.trainers.checkpoints import StagedCheckpointTrainer
from openrealm.trainers.output import quiet_trainer_logs
from openrealm.trainers.stage_utils import (
    eval_mode,
    google_training_arguments,
)

MLM_PROBABILITY = 0.15  # BERT's


class CorpusBlocks(torch.utils.data.Dataset):
    """The corpus's blocks that are not removed, each as `[CLS] title [SEP] body [SEP]` (input_ids, token_type_ids,
    attention_mask: lists of at most max_length ids), the retriever's layout of a block."""

    def __init__(self, blocks, tokenizer, max_length: int, removed: set[int] | frozenset = frozenset()):
        self.blocks, self.tokenizer, self.max_length = blocks, tokenizer, max_length
        self.ids = [i for i, block_id in enumerate(blocks["block_id"]) if block_id not in removed]
        if not self.ids:
            raise ValueError("the corpus has no blocks left to train on (all are removed)")

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, item: int) -> dict[str, list[int]]:
        row = self.blocks[self.ids[item]]
        return block_retriever_inputs(row["title_ids"], row["token_ids"], self.tokenizer, self.max_length)


class MaskedLmModel(nn.Module):
    """BERT's masked-LM loss on a RealmKnowledgeAugEncoder: input_ids, token_type_ids, attention_mask, labels [B, L]
    (-100 where nothing is predicted) -> loss (mean cross-entropy over the N predicted positions), accuracy [scalar];
    both 0 when N is 0."""

    def __init__(self, encoder: RealmKnowledgeAugEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, token_type_ids, labels) -> ModelOutput:
        hidden = self.encoder.realm(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True
        ).last_hidden_state
        chosen = labels != -100
        if not bool(chosen.any()):  # the masking chose no wordpiece: a zero loss reaching every weight, not a NaN
            loss = self.encoder.cls(hidden[:, :1]).float().sum() * 0.0
            return ModelOutput(loss=loss, accuracy=torch.zeros((), device=loss.device))
        logits = self.encoder.cls(hidden[chosen]).float()  # [N, V]
        targets = labels[chosen]
        loss = nn.functional.cross_entropy(logits, targets)
        accuracy = (logits.argmax(-1) == targets).float().mean()
        return ModelOutput(loss=loss, accuracy=accuracy)


def expected_dropped(blocks, max_length: int) -> tuple[int, dict[str, int], dict[str, tuple[str, str]]]:
    """What an epoch of BERT masking over `blocks` read at max_length drops, on average: (blocks, dropped by cause,
    causes for trainers.dropped). A block of n wordpieces (title and body as read, at most max_length - 3) gets no
    chosen wordpiece with probability (1 - MLM_PROBABILITY)^n, and then trains nothing. Counted with numpy from the
    Arrow lengths."""
    import numpy as np
    import pyarrow.compute as pc

    columns = blocks.with_format("arrow")
    read = np.minimum(
        pc.list_value_length(columns["title_ids"]).to_numpy() + pc.list_value_length(columns["token_ids"]).to_numpy(),
        max(max_length - 3, 0),
    )
    expected = round(float(((1 - MLM_PROBABILITY) ** read).sum()))
    causes = {
        "no_wordpiece_chosen": (
            f"BERT's masking (each wordpiece with probability {MLM_PROBABILITY}) chooses none of the wordpieces of "
            f"their block, which holds {read.mean():.1f} on average at --max-seq-len {max_length}",
            "train on longer blocks (a corpus of longer articles), or raise --max-seq-len",
        )
    }
    return len(read), {"no_wordpiece_chosen": expected}, causes


def collator(tokenizer, seed: int | None = None):
    """transformers' BERT masking (15%; 80% [MASK], 10% random, 10% kept), special tokens and padding never chosen;
    `seed` fixes the masks (the evaluation blocks)."""
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(
        tokenizer, mlm=True, mlm_probability=MLM_PROBABILITY, return_tensors="pt", seed=seed
    )


@torch.no_grad()
def evaluate(model: MaskedLmModel, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Masked-LM loss and accuracy over fixed, already masked batches (token-weighted means)."""
    with eval_mode(model):
        device = next(model.parameters()).device
        loss = correct = count = 0.0
        for batch in batches:
            batch = {name: tensor.to(device) for name, tensor in batch.items()}
            n = int((batch["labels"] != -100).sum())
            if n == 0:  # nothing masked in this batch: nothing to score
                continue
            out = model(**batch)
            loss, correct, count = loss + float(out.loss) * n, correct + float(out.accuracy) * n, count + n
    return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1), "masked_tokens": int(count)}


def eval_batches(dataset: CorpusBlocks, tokenizer, size: int, batch_size: int, seed: int) -> list[dict]:
    """`size` blocks spread evenly over the corpus, masked once with `seed`: every evaluation scores the same masks."""
    size = min(size, len(dataset))
    if size <= 0:
        return []
    picks = [round(i * len(dataset) / size) for i in range(size)]
    collate = collator(tokenizer, seed=seed)
    rows = [dataset[i] for i in picks]
    return [collate(rows[start : start + batch_size]) for start in range(0, size, batch_size)]


def build_trainer(args: argparse.Namespace, model: MaskedLmModel, tokenizer, dataset: CorpusBlocks):
    """A transformers Trainer with BERT's optimiser (stage_utils.google_training_arguments), as train ict."""
    multi_process = int(os.environ.get("WORLD_SIZE", "1")) > 1
    training_args = google_training_arguments(
        args, use_cpu=not torch.cuda.is_available() and (multi_process or args.bf16)
    )
    trainer = StagedCheckpointTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        data_collator=collator(tokenizer),
        towers={"encoder": RealmKnowledgeAugEncoder},  # checkpoint-N/encoder/
    )
    return quiet_trainer_logs(trainer, verbose=getattr(args, "verbose", False))


__all__ = [
    "collator",
    "CorpusBlocks",
    "evaluate",
    "MaskedLmModel",
]
