"""`pipeline("question-answering")` for REALM open-QA checkpoints (transformers 5 has no such task any more).

    qa = pipeline("question-answering", model="path/or/repo")       # after `import openrealm`
    qa("Who wrote Hamlet?")      -> {"answer", "score", "block_id", "title", "text", "start", "end", "retrieval_score"}
    qa(["q1", "q2"], top_k=3)   -> one list of answers per question (questions are batched); at most top_k: fewer
                                   when the blocks read hold fewer spans (an answer is always a span of a block)
    qa("Who wrote Hamlet?", top_k=3, num_blocks=5, num_retrieved=20, return_blocks=True)
                                -> {"answers": [3 answers], "blocks": [20 retrieved blocks, best first, 5 "read"]}
    qa("Who wrote it?", context="Hamlet is a tragedy by William Shakespeare.")   -> reads only the given text

A corpus built with `openrealm corpus build --passages-as-blocks` stores each block's passage id (e.g. DPR's): answers
and blocks then also carry "passage_id", after "block_id"; one built from a folder of documents carries "path", the
document's path in that folder.

Your own corpus instead of the model's (`openrealm corpus build` with the model's tokenizer, then `openrealm index
build --embedder MODEL`):

    qa = pipeline("question-answering", model="path/or/repo", corpus="my_corpus")   # index: my_corpus/block_index
    qa = pipeline("question-answering", model="path/or/repo", corpus="my_corpus", index="my_index")

A corpus of another vocabulary than the model's, or an index that another model built, is refused when the pipeline is
made (`check_retriever_fits`).

`score` is the probability of the (block, span) pair under the reader's joint softmax over every span of every block
read; answers are cut from the original text (original casing) through the tokenizer's offsets, and `text[start:end]`
is the answer (`start`/`end` are None in the rare case the span cannot be mapped back to the text).
"""

import numbers

import torch
from transformers import Pipeline
from transformers.utils import logging

from .modeling_realm import check_retriever_fits, check_tokenizer_fits, span_candidates
from .retrieval_realm import RealmRetriever

logger = logging.get_logger(__name__)


def positive_integer(name: str, value, meaning: str) -> int:
    """value as an int, or a ValueError naming the argument and its range (integers from 1; bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} ({meaning}) must be an integer of at least 1, got {value!r}.")
    return int(value)


def question_text(number: int, question) -> str:
    """Question `number` as a non-empty str (bytes decoded as UTF-8), or a ValueError saying what is wrong."""
    if isinstance(question, (bytes, bytearray)):
        try:
            question = bytes(question).decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"question {number} is bytes that are not valid UTF-8 ({error.reason} at byte {error.start}): pass "
                "a str, or bytes encoded as UTF-8."
            ) from None
    if not isinstance(question, str):
        raise ValueError(f"question {number} must be a str (or UTF-8 bytes), got {type(question).__name__}.")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as error:  # e.g. bytes that were not UTF-8, read with errors="surrogateescape"
        raise ValueError(
            f"question {number} is not text: it holds the lone surrogate U+{ord(question[error.start]):04X} at "
            f"character {error.start} (bytes that were not UTF-8?)."
        ) from None
    if not question.strip():
        raise ValueError(f"question {number} is empty or whitespace ({question!r}): give a non-empty string.")
    return question


def _with_passage_ids(items: list[dict], records, block_ids: list[int]) -> list[dict]:
    """items (one dict per block of block_ids) with "passage_id" added after "block_id" when the corpus stores passage
    ids (`corpus build --passages-as-blocks`: e.g. DPR's psgs_w100.tsv ids; None for a block without one), or "path"
    when they are documents' paths (a corpus built from a folder of documents)."""
    if not getattr(records, "has_passage_ids", False):
        return items
    name = "path" if getattr(records, "ids_are_paths", False) else "passage_id"
    with_ids = []
    for item, passage_id in zip(items, records.passage_ids(block_ids)):
        entry = {}
        for key, value in item.items():
            entry[key] = value
            if key == "block_id":
                entry[name] = passage_id
        with_ids.append(entry)
    return with_ids


class RealmQuestionAnsweringPipeline(Pipeline):
    """Open-domain question answering with a `RealmForOpenQA` model and its retriever."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __init__(self, *args, corpus=None, index=None, **kwargs):
        """corpus: a corpus folder to answer from instead of the model's own (with its block_index/, or `index`: an
        index folder or root built from it by the model)."""
        super().__init__(*args, **kwargs)
        source = self.model.name_or_path or "the model"
        check_tokenizer_fits(self.tokenizer, self.model.config.vocab_size, source)
        if index is not None and corpus is None:
            raise ValueError("index= names the index of a corpus: give the corpus too (corpus=...)")
        if corpus is not None:
            retriever = RealmRetriever.from_pretrained(corpus, index=index, require_index=True)
            check_retriever_fits(self.model, retriever, source, tokenizer=self.tokenizer)
            self.model.retriever = retriever

    def _sanitize_parameters(
        self,
        top_k=None,
        context=None,
        num_blocks=None,
        max_question_length=None,
        num_retrieved=None,
        return_blocks=None,
        **kwargs,
    ):
        forward_params = {}
        if top_k is not None:
            forward_params["top_k"] = positive_integer("top_k", top_k, "answers returned per question")
        if num_blocks is not None:
            forward_params["num_blocks"] = positive_integer("num_blocks", num_blocks, "retrieved blocks read")
        if num_retrieved is not None:
            forward_params["num_retrieved"] = positive_integer("num_retrieved", num_retrieved, "blocks retrieved")
        if return_blocks:
            if context is not None:
                raise ValueError(
                    "return_blocks lists the retrieved blocks, but a question with a context retrieves none."
                )
            forward_params["return_blocks"] = True
        preprocess_params = {"context": context} if context is not None else {}
        if max_question_length is not None:
            preprocess_params["max_question_length"] = self._check_max_question_length(max_question_length)
        return preprocess_params, forward_params, {}

    def _check_max_question_length(self, value) -> int:
        """max_question_length counts the question's wordpieces with [CLS] and [SEP]: at least 3 (one question
        wordpiece), at most reader_seq_len - 2 (room for one block wordpiece and the closing [SEP])."""
        reader_seq_len = self.model.config.reader_seq_len
        low, high = 3, reader_seq_len - 2
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
            raise ValueError(
                f"max_question_length must be an integer from {low} to {high} (the reader input holds "
                f"config.reader_seq_len={reader_seq_len} wordpieces: [CLS] question [SEP] block [SEP]), got {value!r}."
            )
        return int(value)

    def __call__(self, question: str | list[str] | None = None, context: str | None = None, **kwargs):
        """Answer one question (-> dict, or a list of top_k dicts) or a list of questions (-> a list of those).
        A question given as bytes is read as UTF-8."""
        if question is None:
            question = kwargs.pop("inputs", None) or kwargs.pop("question", None)
        single = isinstance(question, (str, bytes, bytearray))
        questions = [question] if single else list(question or [])
        if not questions:
            raise ValueError("The question-answering pipeline needs a question (a non-empty string or list of them).")
        questions = [question_text(number, text) for number, text in enumerate(questions)]
        batch_size = kwargs.pop("batch_size", None)
        if batch_size is None:
            batch_size = self._batch_size if self._batch_size is not None else 8
        batch_size = positive_integer("batch_size", batch_size, "questions per forward pass")
        preprocess_params, forward_params, _ = self._sanitize_parameters(context=context, **kwargs)
        top_k = forward_params.get("top_k", 1)
        results = []
        for start in range(0, len(questions), batch_size):
            model_inputs = self.preprocess(questions[start : start + batch_size], **preprocess_params)
            with torch.inference_mode():
                results.extend(self._forward(model_inputs, **forward_params))
        if not forward_params.get("return_blocks"):
            results = [answers[0] if top_k == 1 else answers for answers in results]
        return results[0] if single else results

    def preprocess(self, questions, context: str | None = None, max_question_length: int | None = None):
        questions = [questions] if isinstance(questions, str) else questions
        max_length = max_question_length or self.model.config.reader_seq_len // 2
        full_lengths = [len(ids) for ids in self.tokenizer(questions)["input_ids"]]
        for number, length in enumerate(full_lengths):
            if length > max_length:
                logger.warning(f"Question {number} has {length} wordpieces; truncated to {max_length}.")
        encoded = self.tokenizer(questions, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {"encoded": encoded, "questions": questions, "context": context}

    def _forward(
        self,
        model_inputs,
        top_k: int = 1,
        num_blocks: int | None = None,
        num_retrieved: int | None = None,
        return_blocks: bool = False,
    ):
        """Per question: its top_k answers, or with return_blocks {"answers": [...], "blocks": [...]}, where blocks
        are every retrieved block (max(num_retrieved, blocks read) of them, best first), each marked `read` or not."""
        encoded = model_inputs["encoded"].to(self.device)
        if model_inputs["context"] is not None:
            return [
                self._read_context(encoded, row, model_inputs["context"], top_k)
                for row in range(encoded["input_ids"].shape[0])
            ]
        output = self.model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            token_type_ids=encoded.get("token_type_ids"),
            reader_beam_size=num_blocks,
            searcher_beam_size=num_retrieved,
            output_reader_logits=True,
            return_dict=True,
        )
        num_read = output.reader_input_ids.shape[1]
        reader_logits = output.reader_output.reader_logits
        results = []
        for b in range(encoded["input_ids"].shape[0]):
            logits = reader_logits[b] if reader_logits.dim() == 3 else reader_logits
            answers = self._answers(output, b, self._top_spans(logits, output.reader_input_ids[b], top_k))
            results.append(
                {"answers": answers, "blocks": self._blocks(output, b, num_read)} if return_blocks else answers
            )
        return results

    def _answers(self, output, b: int, candidates: list[tuple[int, int, int, float]]) -> list[dict]:
        """Question b's answers, one per (read block, start, end, probability) candidate."""
        records = self.model.retriever.block_records
        block_ids = [output.retrieved_block_ids[b, r].item() for r, _, _, _ in candidates]
        answers = []
        for (r, start, end, score), block_id, text, title in zip(
            candidates, block_ids, records.texts(block_ids), records.titles(block_ids)
        ):
            span = self._span_offsets(text, output.reader_input_ids[b, r], start, end)
            answer = (
                text[span[0] : span[1]]
                if span
                else self.tokenizer.decode(output.reader_input_ids[b, r, start : end + 1])
            )
            answers.append(
                {
                    "answer": answer,
                    "score": score,
                    "block_id": block_id,
                    "title": title,
                    "text": text,
                    "start": span[0] if span else None,
                    "end": span[1] if span else None,
                    "retrieval_score": output.retrieved_logits[b, r].item(),
                }
            )
        return _with_passage_ids(answers, records, block_ids)

    def _blocks(self, output, b: int, num_read: int) -> list[dict]:
        """Every block retrieved for question b, best first; the first num_read were read."""
        records = self.model.retriever.block_records
        block_ids = output.retrieved_block_ids[b].tolist()
        blocks = [
            {"block_id": block_id, "title": title, "text": text, "retrieval_score": logit, "read": rank < num_read}
            for rank, (block_id, title, text, logit) in enumerate(
                zip(
                    block_ids, records.titles(block_ids), records.texts(block_ids), output.retrieved_logits[b].tolist()
                )
            )
        ]
        return _with_passage_ids(blocks, records, block_ids)

    def postprocess(self, model_outputs):
        return model_outputs

    def _top_spans(self, reader_logits: torch.Tensor, input_ids: torch.Tensor, top_k: int):
        """The top_k (block, start, end, probability) by joint logit, distinct answer token sequences, all inside
        their block: fewer when the blocks hold fewer spans (the reader masks the others, mask_to_score, and they are
        the question, [SEP] or padding, never an answer)."""
        seq_len = input_ids.shape[-1]
        starts, ends = span_candidates(seq_len, self.model.config.max_span_width, reader_logits.device)
        logits = reader_logits.float().reshape(-1)
        probabilities = logits.softmax(-1)
        masked = torch.finfo(reader_logits.dtype).min / 2  # a masked span's logit is finfo.min plus its own
        order = torch.argsort(logits, descending=True)
        chosen, seen = [], set()
        for flat in order.tolist():
            if logits[flat] <= masked:
                break
            block, span = divmod(flat, starts.shape[0])
            start, end = starts[span].item(), ends[span].item()
            key = tuple(input_ids[block, start : end + 1].tolist())
            if key in seen:
                continue
            seen.add(key)
            chosen.append((block, start, end, probabilities[flat].item()))
            if len(chosen) == top_k:
                break
        return chosen

    def _span_offsets(self, block_text: str, reader_row: torch.Tensor, start: int, end: int) -> tuple[int, int] | None:
        """The answer's (start, end) character offsets in the block's original text, mapped from reader positions
        through the tokenizer's offsets; None if the span lies outside the block's wordpieces."""
        row = reader_row.tolist()
        block_start = row.index(self.tokenizer.sep_token_id) + 1
        offsets = self.tokenizer(block_text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        first, last = start - block_start, end - block_start
        if 0 <= first <= last < len(offsets):
            return offsets[first][0], offsets[last][1]
        return None

    def _read_context(self, encoded, row: int, context: str, top_k: int):
        """Read only the given context (split into reader-sized windows), no retrieval."""
        question = [
            i for i, keep in zip(encoded["input_ids"][row].tolist(), encoded["attention_mask"][row].tolist()) if keep
        ][1:-1]
        max_length = self.model.config.reader_seq_len
        budget = max_length - len(question) - 3
        context_tokens = self.tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = context_tokens["input_ids"], context_tokens["offset_mapping"]
        if not ids:
            raise ValueError("The context is empty: give the text the answer should be read from.")
        windows = [(begin, min(begin + budget, len(ids))) for begin in range(0, len(ids), max(budget // 2, 1))]
        windows = [w for i, w in enumerate(windows) if i == 0 or windows[i - 1][1] < len(ids)]
        cls_id, sep_id, pad_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id
        seq_len = max(len(question) + 3 + (end - begin) for begin, end in windows)
        seq_len = max(seq_len, self.model.config.max_span_width)
        input_ids = torch.full((len(windows), seq_len), pad_id, dtype=torch.long)
        token_type_ids = torch.zeros_like(input_ids)
        attention_mask = torch.zeros_like(input_ids)
        block_mask = torch.zeros_like(input_ids, dtype=torch.bool)
        for w, (begin, end) in enumerate(windows):
            tokens = [cls_id, *question, sep_id, *ids[begin:end], sep_id]
            input_ids[w, : len(tokens)] = torch.tensor(tokens)
            attention_mask[w, : len(tokens)] = 1
            token_type_ids[w, len(question) + 2 : len(tokens)] = 1
            block_mask[w, len(question) + 2 : len(tokens) - 1] = True
        device = self.device
        output = self.model.reader(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            token_type_ids=token_type_ids.to(device),
            relevance_score=torch.zeros(len(windows), device=device),
            block_mask=block_mask.to(device),
            output_reader_logits=True,
            return_dict=True,
        )
        answers = []
        for w, start, end, score in self._top_spans(output.reader_logits, input_ids, top_k):
            first = windows[w][0] + start - (len(question) + 2)
            last = windows[w][0] + end - (len(question) + 2)
            answers.append(
                {
                    "answer": context[offsets[first][0] : offsets[last][1]],
                    "score": score,
                    "start": offsets[first][0],
                    "end": offsets[last][1],
                }
            )
        return answers


def question_answerer(model: str, corpus=None, index=None, device=None, **kwargs) -> RealmQuestionAnsweringPipeline:
    """`pipeline("question-answering")` of a RealmForOpenQA folder or Hub id, answering from its own corpus or from
    `corpus` (a folder of the user's, with `index`, default CORPUS/block_index). With a corpus the model is loaded
    without its own (`RealmForOpenQA.from_pretrained(model, corpus=..., index=...)`): a published model's corpus is
    not downloaded. What `openrealm ask` and `openrealm demo` load. kwargs go to pipeline()."""
    from transformers import pipeline

    from .modeling_realm import RealmForOpenQA

    if corpus is None:
        if index is not None:
            raise ValueError("index= names the index of a corpus: give the corpus too (corpus=...)")
        return pipeline("question-answering", model=model, device=device, **kwargs)
    loaded = RealmForOpenQA.from_pretrained(model, corpus=corpus, index=index)
    return pipeline("question-answering", model=loaded, tokenizer=model, device=device, **kwargs)


__all__ = ["RealmQuestionAnsweringPipeline", "question_answerer"]
