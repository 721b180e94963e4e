"""Rules that assume a KV cache's layout: the cache writes and reads around attention (STR031-STR033),
by op and by kernel name.
"""

from __future__ import annotations

import functools
from typing import Any

from analyzer.analyses.walk.registry import _COPY_OPS, _V, DEFAULT_THRESHOLDS, KNOWLEDGE

_KV_OPS = KNOWLEDGE.words("kv_write_ops")


WEAK_WRITE, STRONG_WRITE, CACHE_READ = 1, 2, 3


_CACHE_READ_OPS = _V("cache_read_ops")


def _write_kind(named: bool, op: str | None) -> int:
    """0: no write; WEAK_WRITE: a plain ``copy_`` (a cache slice's write, or a ``.contiguous()``);
    STRONG_WRITE: a named cache store or a cat / index_copy_ / index_put_ / slice_scatter op;
    CACHE_READ: a gather (a paged cache hands back its keys and values gathered from the blocks)."""
    if named:
        return STRONG_WRITE
    if op in _CACHE_READ_OPS:
        return CACHE_READ
    if op not in _KV_OPS:
        return 0
    return WEAK_WRITE if op in _COPY_OPS else STRONG_WRITE


@functools.lru_cache(maxsize=4096)
def _kv_update_positions(
    tokens: tuple[tuple[str, str | None], ...],
    writes: tuple[int, ...],
    before_attention: bool = True,
    max_search: int = int(DEFAULT_THRESHOLDS.max_square_search),
    kv_writes: int = int(DEFAULT_THRESHOLDS.kv_writes),
    trailing_prep: bool = False,
) -> tuple[frozenset[int], frozenset[int]]:
    """Which generic kernels between the QKV GEMMs and attention are the KV-cache update, and which
    are the attention's own input copies.

    ``tokens`` (kernel name, launching op) and ``writes`` (:func:`_write_kind`) per generic kernel of
    the region, in order. Where only plain copies and gathers follow the last strong write (a cat /
    index_copy_ / named store), the gathers are the update's (a paged cache hands back its keys and
    values) and the copies the attention's (the attention interface's ``.contiguous()`` copies); the
    update is then found before them. The update ends the region with the last two write ops (keys
    and values). RoPE applies one kernel sequence to q and then to k: the last such repeated
    sequence (its unit holds more than write ops) ends RoPE; the generic work between it and the
    two writes (a static cache's lazy fills, its index arithmetic) is the update's, except further
    write ops there (partial rotary concatenates the rotated and the passed-through halves): RoPE's.
    Without a repeated sequence only the trailing writes (at most two) are the update. Where a GEMM,
    not attention, follows (MLA caches the latent before decompressing it; the query's cat may come
    after the update), the update is the first two writes after RoPE. Memoised: the same region
    repeats in every layer and step. ``max_search`` / ``kv_writes``: the thresholds of those names."""
    n = len(tokens)
    if not before_attention:
        end = _last_square_end(tokens, writes, n, max_search)
        if end < n:
            first_writes = [j for j in range(end, n) if writes[j] == STRONG_WRITE][:kv_writes]
            return frozenset(first_writes), frozenset()
        # no repeated RoPE sequence: the first two cat / store ops; plain copies before a GEMM
        # are casts (a q/k norm's, say), never the update
        strong = [j for j in range(n) if writes[j] == STRONG_WRITE]
        return frozenset(strong[:kv_writes] if len(strong) >= kv_writes else ()), frozenset()
    reads: frozenset[int] = frozenset()
    gathered: set[int] = set()
    if trailing_prep and n and not writes[n - 1]:
        # without host ops (a graph replay), the attention's own input work (its mask, its
        # positions: arange, fills) may follow the cache's writes: it is the attention's
        last_write = max((j for j in range(n) if writes[j] == STRONG_WRITE), default=-1)
        if last_write >= 0 and n - last_write - 1 <= _MAX_TRAILING_PREP:
            reads = frozenset(range(last_write + 1, n))
            n = last_write + 1
    if n and writes[n - 1] in (WEAK_WRITE, CACHE_READ):
        last_strong = max((j for j in range(n) if writes[j] == STRONG_WRITE), default=-1)
        after = range(last_strong + 1, n)
        if last_strong >= 0 and all(writes[j] in (WEAK_WRITE, CACHE_READ) for j in after):
            # the cache's gathers belong to its update; the copies after them to the attention
            gathered = {j for j in after if writes[j] == CACHE_READ}
            reads = frozenset(j for j in after if writes[j] == WEAK_WRITE)
            n = last_strong + 1
    tail: list[int] = []
    if trailing_prep and reads:
        # a graph replay's copies are casts and contiguous copies as often as writes: only the
        # named stores (cat, index_copy, scatter) after RoPE's repeated q / k sequence are the
        # update (a cat inside that sequence is RoPE's rotate_half; none after it: no cache, as in
        # training, and nothing here is the update or the attention's)
        end = _last_square_end(tokens, writes, n, max_search)
        strong = [j for j in range(end, n) if writes[j] == STRONG_WRITE][-kv_writes:]
        if end >= n or not strong:
            return frozenset(), frozenset()
        first = min(strong)
        gathers = {j for j in reads if writes[j] == CACHE_READ}  # a paged cache's gathers: the update's
        update = {*strong, *gathers, *(j for j in range(end, first) if not writes[j])}
        return frozenset(update), frozenset(reads - gathers)
    for j in range(n - 1, -1, -1):
        if writes[j] not in (WEAK_WRITE, STRONG_WRITE) or len(tail) == kv_writes:
            break
        tail.append(j)
    if not tail:
        return frozenset(gathered), reads
    first = min(tail)
    end = _last_square_end(tokens, writes, first, max_search)
    out = set(tail) | gathered
    out.update(j for j in range(end, first) if not writes[j])
    return frozenset(out), reads


_MAX_TRAILING_PREP = 8  # an attention's input work after the cache writes: arange, fills, a mask's ops


_STRONG_WRITE_WORDS = KNOWLEDGE.words("kv_store_kernel_words")


_CACHE_READ_WORDS = KNOWLEDGE.words("cache_read_kernel_words")


@functools.lru_cache(maxsize=4096)
def _name_write(name: str) -> int:
    """Without a launching op: a cache store by its kernel's name (cat, index_copy, scatter), else none."""
    if any(w in name for w in _STRONG_WRITE_WORDS):
        return STRONG_WRITE
    return CACHE_READ if any(w in name for w in _CACHE_READ_WORDS) else 0


def _last_square_end(
    tokens: tuple[Any, ...],
    writes: tuple[int, ...],
    limit: int,
    max_search: int = int(DEFAULT_THRESHOLDS.max_square_search),
) -> int:
    """End of the last back-to-back repeated block (unit of >= 2 kernels, not only writes) in
    ``tokens[:limit]``: the greatest end of any such block, so that a shorter repeat before RoPE
    (a scale applied to q and to k, a norm's cast-and-multiply pairs) cannot hide RoPE's own q / k
    repeat behind it; ``limit`` when there is none. A kernel is its launching op where known (the
    same op on q and on k may pick another vectorized kernel)."""
    if limit > max_search:
        return limit  # an unrecognised stretch, not a RoPE region: the search is cubic and more
    tokens = tuple(t[1] or t[0] for t in tokens)
    # blocks ending later first: the first found is the last block
    for end in range(limit, 3, -1):
        for size in range(2, end // 2 + 1):
            s = end - 2 * size
            if tokens[s : s + size] == tokens[s + size : end] and not all(writes[s : s + size]):
                return end
    return limit
