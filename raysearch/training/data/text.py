r"""20 Newsgroups as padded word-index sequences, as in MbLS Table 6 (no download).

The MbLS text benchmark (Liu et al., "The Devil is in the Margin: Margin-based Label Smoothing
for Network Calibration", CVPR 2022, arXiv:2111.15430, Sec. 5 and App. B, Table 6) trains a
global-pooling CNN (:mod:`raysearch.training.models.text`) on 20 Newsgroups with frozen GloVe
embeddings. Its released loader (``calibrate/data/newsgroup.py`` of by-liu/MbLS, taken from
Mukhoti et al.'s ``NewsGroup/ng_loader.py``, NeurIPS 2020) is reproduced here without Keras:

1. **Files.** Every group folder (sorted by name) of the tree is one class; its messages are
   the files with all-digit names (sorted as strings), read as latin-1 text with universal
   newlines (``open(path, encoding="latin-1")``).
2. **Header.** The text from the first blank line on is kept: ``i = t.find("\n\n")``; if
   ``0 < i``: ``t = t[i:]`` (a message opening with a blank line, or without one, is kept
   whole) (:func:`strip_header`).
3. **Words** (Keras ``text_to_word_sequence`` defaults, :func:`text_to_words`): lowercase,
   each character of :data:`KERAS_FILTERS` (ASCII punctuation except the apostrophe, tab and
   newline) becomes a space, split on single spaces, empty strings dropped. As in Keras, other
   whitespace (form feed, ``\xa0``) is part of a word.
4. **Vocabulary** (Keras ``Tokenizer(num_words=MAX_WORDS)``, :func:`fit_vocabulary`): words
   ranked by their count over the TRAINING split only (ties: first occurrence first, in the
   order of the files above); word i of the ranking gets index i + 1 (0 is padding) and only
   indices below ``MAX_WORDS`` are kept, i.e. the ``MAX_WORDS - 1 = 19,999`` most frequent
   words, as Keras ``texts_to_sequences`` with ``num_words=20000`` does (MbLS's embedding
   matrix has ``num_words = 20,000`` rows, row 0 unused).
5. **Sequences** (:func:`texts_to_tokens`): the indices of the words in the vocabulary, in
   text order (other words dropped), truncated and zero-padded at the front to ``MAX_LEN``
   (Keras ``pad_sequences`` defaults ``padding="pre"``, ``truncating="pre"``: the LAST 1,000
   words are kept).

Differences from the released code, on purpose: the vocabulary is fitted on the training split
only (MbLS and Mukhoti et al. fit it on all 19,997 messages, test included); the splits are
stratified ``train_test_split`` carves with ``random_state=seed`` (the released code shuffles
with ``np.random.seed`` and slices); the released MbLS config leaves ``max_num_words`` at its
default 2,000 (1,999 words) while its comments and Mukhoti et al. use 20,000, which is used here.

Layouts of `data_dir` (:func:`load_newsgroups20`):

- **original**: ``20_newsgroups/<group>/<numeric id>`` (``20news-19997.tar.gz``, the tree the
  MbLS code reads; ``20_newsgroup/`` is accepted too), `data_dir` being the folder above it or
  the tree itself. Split as in MbLS App. B: ``int(test_fraction * N)`` messages (default 20%:
  3,999 of 19,997) held out as test, then 900 of the rest as validation: 15,098 / 900 / 3,999.
- **bydate**: ``20news-bydate-train/<group>/<id>`` and ``20news-bydate-test/<group>/<id>``
  (``20news-bydate.tar.gz``, e.g. extracted into ``~/scikit_learn_data/20news_home/``; a
  `data_dir` holding ``20news_home/`` is accepted too). Test is the bydate test split (7,532
  messages); 900 of the bydate train split (11,314) are carved as validation. Note that
  scikit-learn's ``fetch_20newsgroups`` deletes ``20news_home/`` once it has written its
  ``.pkz`` cache: extract the archive yourself.

Validation size. Without `val_fraction`, validation holds ``min(900, pool // 10)`` messages of
the training pool (:func:`default_val_size`): exactly 900 on the real data (pools of 15,998 and
11,314 messages, or any pool of at least 9,000), fewer on small or long-tailed pools, so that
validation never takes more than a tenth of the pool. With `val_fraction`, that share of the
pool (``train_test_split``'s rounding). Either way the carve is stratified by label with
``random_state=seed``; a pool too small to give every class a sample on both sides raises a
:class:`~raysearch.training.data.splits.DatasetError`.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from raysearch.training.data.splits import (
    DatasetError,
    DatasetSplits,
    _split,
    class_counts_text,
    long_tail_indices,
)

__all__ = [
    "KERAS_FILTERS",
    "MAX_LEN",
    "MAX_WORDS",
    "NEWSGROUPS_TEST_FRACTION",
    "NEWSGROUPS_VAL_SIZE",
    "TextDatasetSplits",
    "default_val_size",
    "fit_vocabulary",
    "load_newsgroups20",
    "original_split_indices",
    "strip_header",
    "text_to_words",
    "texts_to_tokens",
]

logger = logging.getLogger(__name__)

#: Keras ``Tokenizer(num_words=...)``: word indices below this are kept (19,999 words).
MAX_WORDS = 20000
#: Length of every token sequence (Keras ``pad_sequences(maxlen=1000)`` in MbLS).
MAX_LEN = 1000
#: Validation messages carved from the training pool (MbLS App. B: 15,098 / 900 / 3,999).
NEWSGROUPS_VAL_SIZE = 900
#: Share of all messages held out as test for the original tree (MbLS ``test_split: 0.2``).
NEWSGROUPS_TEST_FRACTION = 0.2
#: Characters Keras's ``Tokenizer`` turns into spaces (its ``filters`` default).
KERAS_FILTERS = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'

_NAME = "newsgroups20"
_ORIGINAL_FOLDERS = ("20_newsgroups", "20_newsgroup")
_BYDATE_TRAIN = "20news-bydate-train"
_BYDATE_TEST = "20news-bydate-test"
_SKLEARN_HOME = "20news_home"
_LAYOUTS = (
    "expected 20_newsgroups/<group>/<numeric id> (the original tree; `data_dir` may be the "
    "folder holding it or the tree itself) or 20news-bydate-train/<group>/<id> and "
    "20news-bydate-test/<group>/<id> (scikit-learn's bydate trees, e.g. "
    "~/scikit_learn_data/20news_home)"
)
_TRANSLATE = str.maketrans({c: " " for c in KERAS_FILTERS})


@dataclass
class TextDatasetSplits(DatasetSplits):
    """:class:`~raysearch.training.data.DatasetSplits` of token sequences, with their vocabulary.

    The splits are ``TensorDataset(tokens int64 (N, L), labels int64 (N,))`` and
    ``input_shape`` is the 1-tuple ``(L,)`` (not (C, H, W)).

    Attributes:
        vocabulary: the words of the vocabulary, most frequent first: token ``i + 1`` is
            ``vocabulary[i]`` (token 0 is padding).
    """

    vocabulary: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        # what a text model's factory takes from the data (gpool_cnn's `vocabulary`)
        self.model_kwargs.setdefault("vocabulary", self.vocabulary)


def strip_header(text: str) -> str:
    r"""Drop a message's header as the MbLS loader does: from its first blank line on.

    ``i = text.find("\n\n")``; the text is returned unchanged when ``i <= 0`` (no blank line,
    or one at the very start). The kept part starts with the blank line itself.

    Args:
        text (str): the whole message.

    Returns:
        str: the message from its first ``"\n\n"`` on.
    """
    i = text.find("\n\n")
    return text[i:] if 0 < i else text


def text_to_words(text: str) -> list[str]:
    r"""Words of `text` as Keras ``text_to_word_sequence`` with its defaults splits them.

    Lowercase, every character of :data:`KERAS_FILTERS` replaced by a space, split on ``" "``,
    empty strings dropped (other whitespace, e.g. ``"\x0c"``, stays inside words, as in Keras).

    Args:
        text (str): any text.

    Returns:
        list[str]: the words, in order.
    """
    return [w for w in text.lower().translate(_TRANSLATE).split(" ") if w]


def fit_vocabulary(texts: Iterable[str], num_words: int = MAX_WORDS) -> list[str]:
    """The vocabulary Keras ``Tokenizer(num_words).fit_on_texts(texts)`` uses for sequences.

    Words are ranked by their count over `texts` (:func:`text_to_words`), ties by first
    occurrence (Keras sorts its ordered word counts with a stable sort); the word of rank i
    gets index i + 1 and Keras keeps indices below `num_words`, so the first ``num_words - 1``
    words are returned.

    Args:
        texts (Iterable[str]): the training texts, in order.
        num_words (int, optional): Keras's ``num_words``, >= 1. Defaults to ``MAX_WORDS``.

    Returns:
        list[str]: at most ``num_words - 1`` words, most frequent first.

    Raises:
        ValueError: if `num_words` < 1.
    """
    if isinstance(num_words, bool) or not isinstance(num_words, int) or num_words < 1:
        raise ValueError(f"`num_words` must be an int >= 1, got {num_words!r}")
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(text_to_words(text))
    # Counter keeps first-insertion order and sorted() is stable: ties stay in that order
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return [word for word, _ in ranked[: num_words - 1]]


def texts_to_tokens(
    texts: Sequence[str], vocabulary: Sequence[str], max_len: int = MAX_LEN
) -> np.ndarray:
    """Keras ``texts_to_sequences`` then ``pad_sequences(maxlen=max_len)`` (pre/pre).

    Args:
        texts (Sequence[str]): N texts.
        vocabulary (Sequence[str]): words; ``vocabulary[i]`` has token ``i + 1``.
        max_len (int, optional): sequence length L, >= 1. Defaults to ``MAX_LEN``.

    Returns:
        np.ndarray: (N, L) int64; row n holds the tokens of the words of text n found in
        `vocabulary`, the last L of them, right-aligned after zeros.

    Raises:
        ValueError: if `max_len` < 1.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"`max_len` must be an int >= 1, got {max_len!r}")
    index = {word: i + 1 for i, word in enumerate(vocabulary)}
    out = np.zeros((len(texts), max_len), dtype=np.int64)
    for row, text in enumerate(texts):
        seq = [index[w] for w in text_to_words(text) if w in index][-max_len:]
        if seq:
            out[row, max_len - len(seq) :] = seq
    return out


def default_val_size(pool_size: int) -> int:
    """Validation messages carved from a training pool without `val_fraction`.

    ``min(NEWSGROUPS_VAL_SIZE, pool_size // 10)``: MbLS's 900 on any pool of at least 9,000
    messages (the real 20 Newsgroups pools: 15,998 original, 11,314 bydate), a tenth of smaller
    pools.

    Args:
        pool_size (int): messages in the pool, >= 0.

    Returns:
        int: the validation size.
    """
    return min(NEWSGROUPS_VAL_SIZE, int(pool_size) // 10)


# --------------------------------------------------------------------------------------------
# splits


def _carve(
    labels: np.ndarray, pool: np.ndarray, size: int | float, seed: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified ``train_test_split`` of `pool` holding out `size` (count or share)."""
    return _split(
        _NAME,
        pool,
        labels,
        size,
        seed,
        what,
        words=("message", "messages", "group", "groups"),
        fix="pass another `val_fraction` / `test_fraction`",
    )


def _train_val(
    labels: np.ndarray,
    pool: np.ndarray,
    *,
    seed: int,
    val_fraction: float | None,
    imbalance_ratio: float | None,
    num_classes: int,
    source: str,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Long tail (optional) then the stratified validation carve of a training pool."""
    info: dict[str, Any] = {}
    if imbalance_ratio is not None:
        pool = pool[
            long_tail_indices(labels[pool], imbalance_ratio, seed=seed, num_classes=num_classes)
        ]
        info["imbalance_ratio"] = float(imbalance_ratio)
        info["class_counts"] = class_counts_text(labels[pool], num_classes)
        source = f"long-tailed (ratio {imbalance_ratio:g}) {source}"
    if val_fraction is None:
        size: int | float = default_val_size(len(pool))
        rule = f"min({NEWSGROUPS_VAL_SIZE}, pool // 10) = {size}"
    else:
        size = float(val_fraction)
        rule = f"{100 * size:g}%"
    train, val = _carve(labels, pool, size, seed, "validation")
    info["val_split"] = f"stratified {rule} of the {source} ({len(pool)} messages), seed {seed}"
    info["val_fraction"] = len(val) / len(pool)
    return np.sort(train), np.sort(val), info


def original_split_indices(
    labels: np.ndarray,
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    imbalance_ratio: float | None = None,
    num_classes: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Train/val/test indices of the original tree (no official test split), as in MbLS.

    Test: ``int(test_fraction * N)`` messages (MbLS's ``num_test_samples``; 3,999 of 19,997),
    stratified, ``random_state=seed``. Then, with `imbalance_ratio`, the rest is long-tailed
    (:func:`~raysearch.training.data.long_tail_indices`), and validation is carved from what is left
    (:func:`default_val_size` messages, or `val_fraction` of it), stratified, same seed.

    Args:
        labels (np.ndarray): (N,) int labels in [0, K).
        seed (int): seed of the carves and of the long tail.
        val_fraction (float, optional): share of the training pool for validation, in (0, 1).
            Defaults to ``None`` (:func:`default_val_size`).
        test_fraction (float, optional): share of all messages for test, in (0, 1). Defaults to
            ``None`` (``NEWSGROUPS_TEST_FRACTION`` = 0.2).
        imbalance_ratio (float, optional): long-tail ratio >= 1, or ``None``.
        num_classes (int, optional): K. Defaults to ``labels.max() + 1``.

    Returns:
        tuple: sorted int64 indices of train, val and test, and ``info`` entries
        (``val_split``, ``val_fraction``, ``test_fraction``, ``test_split``, and with a long
        tail ``imbalance_ratio``, ``class_counts``).

    Raises:
        DatasetError: if a carve cannot give every class a message on both sides.
    """
    labels = np.asarray(labels, dtype=np.int64)
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    test_fraction = NEWSGROUPS_TEST_FRACTION if test_fraction is None else float(test_fraction)
    n_test = int(test_fraction * len(labels))
    pool, test = _carve(labels, np.arange(len(labels)), n_test, seed, "test")
    train, val, info = _train_val(
        labels,
        pool,
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
        num_classes=k,
        source="rest",
    )
    info["test_fraction"] = test_fraction
    info["test_split"] = (
        f"stratified int({test_fraction:g} * {len(labels)}) = {n_test} of all messages, seed {seed}"
    )
    return train, val, np.sort(test), info


# --------------------------------------------------------------------------------------------
# files


def _is_tree(folder: Path) -> bool:
    """Whether `folder` has a sub-folder holding a file with an all-digit name."""
    try:
        return any(
            group.is_dir() and any(f.name.isdigit() and f.is_file() for f in group.iterdir())
            for group in folder.iterdir()
        )
    except OSError:
        return False


def _find_layout(root: Path) -> tuple[str, list[Path]]:
    """``("original", [tree])`` or ``("bydate", [train, test])`` under `root`."""
    if not root.is_dir():
        raise DatasetError(f"{_NAME}: {root} is not a folder; {_LAYOUTS}")
    for base in (root, root / _SKLEARN_HOME):
        train, test = base / _BYDATE_TRAIN, base / _BYDATE_TEST
        if train.is_dir() or test.is_dir():
            missing = [str(p) for p in (train, test) if not p.is_dir()]
            if missing:
                raise DatasetError(f"{_NAME}: {missing[0]} is missing; {_LAYOUTS}")
            return "bydate", [train, test]
    for folder in _ORIGINAL_FOLDERS:
        if (root / folder).is_dir():
            return "original", [root / folder]
    if _is_tree(root):
        return "original", [root]
    raise DatasetError(f"{_NAME}: {root} holds no 20 Newsgroups tree; {_LAYOUTS}")


def _read_tree(tree: Path) -> tuple[list[str], list[str], list[int]]:
    """Group names (sorted), header-stripped texts and their labels, in MbLS's file order."""
    groups = sorted(p.name for p in tree.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(groups) < 2:
        raise DatasetError(
            f"{_NAME}: {tree} holds {len(groups)} group folder(s), at least 2 needed; {_LAYOUTS}"
        )
    texts: list[str] = []
    labels: list[int] = []
    for label, group in enumerate(groups):
        folder = tree / group
        names = sorted(n for n in os.listdir(folder) if n.isdigit() and (folder / n).is_file())
        if not names:
            raise DatasetError(
                f"{_NAME}: group folder {folder} holds no message files (all-digit names); "
                f"{_LAYOUTS}"
            )
        for name in names:
            path = folder / name
            try:
                with open(path, encoding="latin-1") as f:
                    texts.append(strip_header(f.read()))
            except OSError as err:
                raise DatasetError(f"{_NAME}: cannot read {path}: {err}") from err
            labels.append(label)
    return groups, texts, labels


# --------------------------------------------------------------------------------------------
# loader


#: (groups, texts, labels (N,), (train, val, test) indices, info) of a split layout.
_Messages = tuple[list[str], list[str], np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray],
                  dict[str, Any]]


def _split_bydate(
    root: Path, trees: list[Path], *, seed: int, val_fraction: float | None,
    test_fraction: float | None, imbalance_ratio: float | None,
) -> _Messages:
    """The bydate layout's messages: its test split, validation carved from its train split.

    Raises:
        DatasetError: if `test_fraction` is given or the two trees hold different groups.
    """
    if test_fraction is not None:
        raise DatasetError(
            f"{_NAME}: the bydate layout ({root}) has its own test split; `test_fraction` "
            f"applies to the original 20_newsgroups tree only (got {test_fraction})"
        )
    groups, train_texts, train_labels = _read_tree(trees[0])
    test_groups, test_texts, test_labels = _read_tree(trees[1])
    if test_groups != groups:
        only = sorted(set(groups) ^ set(test_groups))
        raise DatasetError(
            f"{_NAME}: {trees[0]} and {trees[1]} hold different groups "
            f"(in one only: {', '.join(only)}); {_LAYOUTS}"
        )
    texts = train_texts + test_texts
    labels = np.asarray(train_labels + test_labels, dtype=np.int64)
    train, val, info = _train_val(
        labels,
        np.arange(len(train_texts)),
        seed=seed,
        val_fraction=val_fraction,
        imbalance_ratio=imbalance_ratio,
        num_classes=len(groups),
        source="bydate train split",
    )
    test = np.arange(len(train_texts), len(texts), dtype=np.int64)
    info["test_split"] = f"bydate test split ({len(test)} messages)"
    return groups, texts, labels, (train, val, test), info


def _split_original(
    root: Path, trees: list[Path], *, seed: int, val_fraction: float | None,
    test_fraction: float | None, imbalance_ratio: float | None,
) -> _Messages:
    """The original tree's messages, split by seed (:func:`original_split_indices`)."""
    groups, texts, label_list = _read_tree(trees[0])
    labels = np.asarray(label_list, dtype=np.int64)
    train, val, test, info = original_split_indices(
        labels,
        seed=seed,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        imbalance_ratio=imbalance_ratio,
        num_classes=len(groups),
    )
    return groups, texts, labels, (train, val, test), info


def load_newsgroups20(
    *,
    seed: int,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    imbalance_ratio: float | None = None,
) -> TextDatasetSplits:
    """20 Newsgroups from `data_dir` as (N, 1000) token sequences (MbLS Table 6).

    See the module docstring for the layouts, the header stripping, the Keras-style tokenizer
    and the split rules. Splits keep the file order (sorted groups, then sorted file names).

    Args:
        seed (int): seed of the carves (``random_state``) and of the long tail.
        val_fraction (float, optional): share of the training pool (the bydate train split, or
            what the test carve leaves of the original tree) held out as validation, in (0, 1).
            Defaults to ``None``: :func:`default_val_size` messages (900 on the real data).
        test_fraction (float, optional): share of all messages held out as test, original tree
            only, in (0, 1). Defaults to ``None`` (0.2: 3,999 of 19,997).
        data_dir (str | os.PathLike, optional): the folder holding either layout; required.
        download (bool, optional): must be ``False``: nothing is downloaded.
        imbalance_ratio (float, optional): long-tail ratio >= 1 of the training pool before the
            validation carve (:func:`~raysearch.training.data.long_tail_indices`), or ``None``. Test
            stays as it is.

    Returns:
        TextDatasetSplits: ``TensorDataset(tokens int64 (N, 1000), labels int64 (N,))``
        splits, ``input_shape=(1000,)``, ``num_classes`` = number of groups (20),
        ``class_names`` = sorted group names, ``name="newsgroups20"``, ``vocabulary``
        (``MAX_WORDS - 1`` words at most, fitted on the training split), and ``info``:
        ``train_size``, ``val_size``, ``test_size``, ``val_split``, ``val_fraction`` (share of
        the pool actually held out), ``test_split``, ``layout`` (``"original"`` or
        ``"bydate"``), ``vocab_size``, ``max_len``, ``max_words``, ``data_dir`` (and
        ``test_fraction`` for the original tree; ``imbalance_ratio``, ``class_counts`` with a
        long tail).

    Raises:
        DatasetError: if `download` is true, `data_dir` is ``None``, missing or holds neither
            layout, a group folder holds no message, the bydate trees have different groups,
            `test_fraction` is given for the bydate layout, or a carve cannot be stratified.
    """
    if download:
        raise DatasetError(
            f"{_NAME} is not downloaded by raysearch: place it in `--data-dir` yourself; {_LAYOUTS}"
        )
    if data_dir is None:
        raise DatasetError(f"{_NAME}: `--data-dir` is required; {_LAYOUTS}")
    root = Path(data_dir).expanduser().absolute()
    layout, trees = _find_layout(root)
    split = _split_bydate if layout == "bydate" else _split_original
    groups, texts, labels, (train, val, test), info = split(
        root, trees, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction,
        imbalance_ratio=imbalance_ratio,
    )
    vocabulary = fit_vocabulary((texts[i] for i in train), MAX_WORDS)
    logger.info(
        "%s: %d messages (%s layout), vocabulary of %d words from %d training messages",
        _NAME,
        len(texts),
        layout,
        len(vocabulary),
        len(train),
    )

    def tensors(index: np.ndarray) -> TensorDataset:
        tokens = texts_to_tokens([texts[i] for i in index], vocabulary, MAX_LEN)
        return TensorDataset(torch.from_numpy(tokens), torch.from_numpy(labels[index]))

    info = {
        "train_size": len(train),
        "val_size": len(val),
        "test_size": len(test),
        **info,
        "layout": layout,
        "vocab_size": len(vocabulary),
        "max_len": MAX_LEN,
        "max_words": MAX_WORDS,
        "data_dir": str(root),
    }
    return TextDatasetSplits(
        train=tensors(train),
        val=tensors(val),
        test=tensors(test),
        num_classes=len(groups),
        input_shape=(MAX_LEN,),  # type: ignore[arg-type]  # (L,), not (C, H, W)
        name=_NAME,
        class_names=list(groups),
        info=info,
        vocabulary=vocabulary,
    )
