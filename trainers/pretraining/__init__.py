"""REALM pre-training's machinery, one file per role; the `train pretrain` job that wires it is
trainers/jobs/train_pretrain.py.

examples.py    masked queries -> top-K candidates from the current index, null document first
model.py       RealmPretrainingModel: the marginal masked-LM likelihood that trains the retriever
trainer.py     the Trainer subclass, collator and callbacks; checkpoints that carry the index in use
refresh.py     IndexRefreshCallback: the index refresh (async, sync, off) and the swap at a step boundary
pending_swaps.py  the async builds in flight: the build running, the version loading, the swap decision
rank_agreement.py  every rank swaps to the same version at the same step (one all-reduce per step boundary)
builder.py     the async builder process, both ends of it
evaluation.py  Figure 4: retrieval utility and recall@k on fixed masked queries
retriever_bound.py  the ceiling of REALM's signal: its retriever objective with a perfect reader over every block
preparation.py the checks and preparations before training (corpus, lengths, index version 0)
preflight.py   `train pretrain --preflight`: does the signal train the retriever here, before a long run
"""

from openrealm.trainers.options import NUM_CANDIDATES
from openrealm.trainers.pretraining.examples import (
    CANDIDATE_SEQ_LEN,
    JOINT_SEQ_LEN,
    NULL_BLOCK_ID,
    QUERY_SEQ_LEN,
    RealmPretrainingExamples,
    continuation_pieces,
    holds_masked_span,
    joint_inputs,
)
from openrealm.trainers.pretraining.model import (
    RealmPretrainingModel,
    RealmPretrainingOutput,
    mean_entropy,
    scale_retrieval_embeddings,
    sharpness_for_entropy,
)

__all__ = [
    "CANDIDATE_SEQ_LEN",
    "JOINT_SEQ_LEN",
    "NULL_BLOCK_ID",
    "NUM_CANDIDATES",
    "QUERY_SEQ_LEN",
    "RealmPretrainingExamples",
    "RealmPretrainingModel",
    "RealmPretrainingOutput",
    "continuation_pieces",
    "holds_masked_span",
    "joint_inputs",
    "mean_entropy",
    "scale_retrieval_embeddings",
    "sharpness_for_entropy",
]
