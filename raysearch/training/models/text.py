"""Text classifiers: the global-pooling CNN of MbLS Table 6 (20 Newsgroups), and GloVe loading.

The network is the ``GlobalPoolingCNN`` of the released MbLS code (by-liu/MbLS,
``calibrate/net/ng_model.py``, with the embedding of ``calibrate/engine/nlp_trainer.py``), itself
Mukhoti et al.'s (torrvision/focal_calibration, ``NewsGroup/ng_model.py``) without its dropout.
The papers call it "GPool-CNN" / "GPCN" and cite Lin et al., "Network in Network" (ICLR 2014).

References:
    Liu et al., "The Devil is in the Margin: Margin-based Label Smoothing for Network
    Calibration", CVPR 2022, arXiv:2111.15430, Sec. 5 and App. B (20 Newsgroups, GloVe, Adam
    1e-3, 100 epochs). Mukhoti et al., "Calibrating Deep Neural Networks using Focal Loss",
    NeurIPS 2020, arXiv:2002.09437. Pennington et al., "GloVe: Global Vectors for Word
    Representation", EMNLP 2014.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["GlobalPoolingCNN", "build_gpool_cnn", "load_glove", "min_length"]

logger = logging.getLogger(__name__)

_KERNEL = 5
_CHANNELS = 128


def min_length(pool_stride: int = 1) -> int:
    """Shortest sequence :class:`GlobalPoolingCNN` accepts (the last convolution needs 1 step).

    Args:
        pool_stride (int, optional): stride of the two max-pools. Defaults to ``1``.

    Returns:
        int: 21 for stride 1 (five layers each shortening by 4), 149 for stride 5.
    """
    length = _KERNEL  # conv3 needs >= 5 steps
    for _ in range(2):  # undo pool (kernel 5) then conv (kernel 5)
        length = (length - 1) * pool_stride + _KERNEL
        length = length + _KERNEL - 1
    return length


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")
    return value


class GlobalPoolingCNN(nn.Module):
    """Word embedding, three 1-D convolutions, global max pooling, two linear layers.

    Layers, as in the released MbLS code (``calibrate/net/ng_model.py`` and the embedding of
    ``calibrate/engine/nlp_trainer.py``)::

        embedding(V + 1 -> E)          # rows 0..V, row 0 = padding; frozen GloVe in MbLS
        conv1d(E -> 128, kernel 5) -> ReLU -> max-pool(kernel 5, stride `pool_stride`)
        conv1d(128 -> 128, kernel 5) -> ReLU -> max-pool(kernel 5, stride `pool_stride`)
        conv1d(128 -> 128, kernel 5) -> ReLU -> max over time (global max pool)
        linear(128 -> 128) -> ReLU -> linear(128 -> K)

    No padding in the convolutions, no dropout (Mukhoti et al. have dropout 0.3 after the first
    linear layer; MbLS removed it), no batch norm; PyTorch's default initialisation. The
    released code pools with ``F.max_pool1d(kernel_size=5, stride=1)``, the default
    ``pool_stride=1`` here (lengths 1000 -> 996 -> 992 -> 988 -> 984 -> 980 before the global
    max); ``pool_stride=5`` gives the Keras example's ``MaxPooling1D(5)`` (996 -> 199 -> 195
    -> 39 -> 35), which is NOT what MbLS ran. The embedding has ``padding_idx=0`` (row 0 gets
    no gradient); MbLS's row 0 is zero and never trained, as is the row of `embeddings` built
    by :func:`load_glove`.

    Args:
        vocab_size (int): number of words V (>= 1); tokens are in [0, V], 0 = padding.
        num_classes (int): number of classes K (>= 2).
        max_len (int, optional): sequence length L the model is built for, >= the shortest the
            layers accept (:func:`min_length`: 21 with stride 1); checked here only, the
            network takes any length >= that. Defaults to ``1000``.
        embedding_dim (int, optional): embedding size E (>= 1). Defaults to ``100`` (GloVe 100d).
        embeddings (Tensor, optional): (V + 1, E) float initial embedding table (e.g. from
            :func:`load_glove`); ``None`` draws it from N(0, 1) (PyTorch's default) with row 0
            zero. Defaults to ``None``.
        freeze_embeddings (bool, optional): with `embeddings`, keep the table fixed
            (``requires_grad=False``), as MbLS does; ignored without `embeddings` (a random
            table is always learned). Defaults to ``True``.
        pool_stride (int, optional): stride of the two max-pools (kernel 5), >= 1. Defaults to
            ``1`` (the released code).

    Shape:
        x: (N, L) int64 tokens in [0, V]; returns logits (N, K) float.

    Raises:
        TypeError: if an integer argument is not an int, or `embeddings` is not a floating
            point tensor.
        ValueError: if `vocab_size` < 1, `num_classes` < 2, `embedding_dim` or `pool_stride`
            < 1, `max_len` is shorter than :func:`min_length`, or `embeddings` is not
            (vocab_size + 1, embedding_dim).
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        *,
        max_len: int = 1000,
        embedding_dim: int = 100,
        embeddings: Tensor | None = None,
        freeze_embeddings: bool = True,
        pool_stride: int = 1,
    ) -> None:
        super().__init__()
        _check_int("vocab_size", vocab_size, 1)
        _check_int("num_classes", num_classes, 2)
        _check_int("embedding_dim", embedding_dim, 1)
        _check_int("pool_stride", pool_stride, 1)
        shortest = min_length(pool_stride)
        _check_int("max_len", max_len, shortest)
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.pool_stride = pool_stride
        if embeddings is None:
            self.embedding = nn.Embedding(vocab_size + 1, embedding_dim, padding_idx=0)
        else:
            if not isinstance(embeddings, Tensor) or not embeddings.is_floating_point():
                raise TypeError(
                    f"`embeddings` must be a float tensor, got {type(embeddings).__name__}"
                    + (f" of {embeddings.dtype}" if isinstance(embeddings, Tensor) else "")
                )
            expected = (vocab_size + 1, embedding_dim)
            if tuple(embeddings.shape) != expected:
                raise ValueError(
                    f"`embeddings` must have shape (vocab_size + 1, embedding_dim) = {expected}, "
                    f"got {tuple(embeddings.shape)}"
                )
            self.embedding = nn.Embedding.from_pretrained(
                embeddings.detach().clone().float(), freeze=bool(freeze_embeddings), padding_idx=0
            )
        self.features = nn.Sequential(
            nn.Conv1d(embedding_dim, _CHANNELS, _KERNEL),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(_KERNEL, stride=pool_stride),
            nn.Conv1d(_CHANNELS, _CHANNELS, _KERNEL),
            nn.ReLU(inplace=True),
            nn.MaxPool1d(_KERNEL, stride=pool_stride),
            nn.Conv1d(_CHANNELS, _CHANNELS, _KERNEL),
            nn.ReLU(inplace=True),
            nn.AdaptiveMaxPool1d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(_CHANNELS, _CHANNELS),
            nn.ReLU(inplace=True),
            nn.Linear(_CHANNELS, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Logits (N, K) of a batch of token sequences (N, L) int64.

        Raises:
            ValueError: if `x` is not a 2-D integer tensor.
        """
        if x.ndim != 2 or x.is_floating_point() or x.is_complex():
            raise ValueError(
                f"GlobalPoolingCNN takes (N, L) integer tokens, got shape {tuple(x.shape)} "
                f"of {x.dtype}"
            )
        emb = self.embedding(x).transpose(1, 2)  # (N, E, L)
        return self.classifier(self.features(emb))


def load_glove(path: str | os.PathLike[str], vocabulary: Sequence[str], dim: int = 100) -> Tensor:
    """Embedding table of `vocabulary` from a GloVe text file (``word v1 ... v_dim`` per line).

    The file is read as utf-8, one line at a time; only the vectors of words in `vocabulary`
    are kept (a word listed twice: its last line wins, as MbLS's dict). Row ``i + 1`` is the
    vector of ``vocabulary[i]``; row 0 (padding) and the rows of words absent from the file are
    zeros, as in MbLS. Lines are split on whitespace (``str.split()``, as MbLS), so a word
    holding a space (a few lines of ``glove.840B``) reads as a malformed line.

    Args:
        path (str | os.PathLike): the GloVe file (e.g. ``glove.6B.100d.txt``).
        vocabulary (Sequence[str]): V distinct words; ``vocabulary[i]`` has token ``i + 1``.
        dim (int, optional): values per line, >= 1. Defaults to ``100``.

    Returns:
        Tensor: (V + 1, dim) float32.

    Raises:
        ValueError: if the file is missing, a line does not hold a word and exactly `dim`
            numbers (the message names the file and line number), a line is not utf-8,
            `vocabulary` holds a duplicate or `dim` < 1.
        TypeError: if `dim` is not an int.
    """
    _check_int("dim", dim, 1)
    index = {word: i + 1 for i, word in enumerate(vocabulary)}
    if len(index) != len(vocabulary):
        raise ValueError(f"`vocabulary` holds duplicate words ({len(vocabulary) - len(index)})")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"GloVe file not found: {file}")
    table = np.zeros((len(vocabulary) + 1, dim), dtype=np.float32)
    found = set()
    lineno = 0
    try:
        with open(file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) != dim + 1:
                    raise ValueError(
                        f"{file}: line {lineno} is malformed: expected a word and {dim} values, "
                        f"got {max(len(parts) - 1, 0)} values"
                    )
                row = index.get(parts[0])
                if row is None:
                    continue
                try:
                    table[row] = np.asarray(parts[1:], dtype=np.float32)
                except ValueError as err:
                    raise ValueError(
                        f"{file}: line {lineno} is malformed: {err}".replace("\n", " ")
                    ) from err
                found.add(row)
    except UnicodeDecodeError as err:
        raise ValueError(f"{file}: line {lineno + 1} is not utf-8 ({err.reason})") from err
    logger.info(
        "GloVe %s: %d of %d vocabulary words found (the others are zero vectors)",
        file,
        len(found),
        len(vocabulary),
    )
    return torch.from_numpy(table)


def build_gpool_cnn(
    *,
    num_classes: int,
    input_shape: Sequence[int],
    vocabulary: Sequence[str] | None = None,
    embeddings_path: str | os.PathLike[str] | None = None,
) -> GlobalPoolingCNN:
    """Registry factory of ``gpool_cnn``: a :class:`GlobalPoolingCNN` for a text dataset.

    Args:
        num_classes (int): number of classes K (>= 2).
        input_shape (Sequence[int]): ``(L,)``, the sequence length (``DatasetSplits.input_shape``
            of a text dataset).
        vocabulary (Sequence[str], optional): the dataset's vocabulary
            (``TextDatasetSplits.vocabulary``); V = ``len(vocabulary)``. Required.
        embeddings_path (str | os.PathLike, optional): a GloVe 100d file; when given the
            embedding is :func:`load_glove` of it, frozen (MbLS's setting). Defaults to ``None``
            (a learned, randomly initialised embedding).

    Returns:
        GlobalPoolingCNN: mapping (N, L) int64 tokens to (N, K) logits.

    Raises:
        ValueError: if `vocabulary` is ``None`` or empty, `input_shape` is not one int ``(L,)``
            with L >= 21, or from :func:`load_glove`.
        TypeError: if `num_classes` is not an int.
    """
    if vocabulary is None:
        raise ValueError(
            "gpool_cnn needs the dataset's `vocabulary` (a text dataset such as newsgroups20), "
            "got None"
        )
    if len(vocabulary) == 0:
        raise ValueError("gpool_cnn needs a non-empty `vocabulary`, got 0 words")
    shape = tuple(input_shape)
    if len(shape) != 1 or isinstance(shape[0], bool) or not isinstance(shape[0], int):
        raise ValueError(
            f"`input_shape` must be (L,) for 'gpool_cnn' (token sequences), got {input_shape}"
        )
    embeddings = None
    if embeddings_path is not None:
        embeddings = load_glove(embeddings_path, vocabulary, dim=100)
    return GlobalPoolingCNN(
        len(vocabulary),
        num_classes,
        max_len=shape[0],
        embedding_dim=100,
        embeddings=embeddings,
        freeze_embeddings=True,
    )
