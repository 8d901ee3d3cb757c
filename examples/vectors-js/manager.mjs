// A KV-cache block manager in JavaScript, written from the prose of spec/README.md (chapters 2-9)
// on top of the pool of chapter 1 (pool.mjs).  It replays kvspec's *manager* conformance vectors
// (docs/VECTORS.md).  Every function is named after the step of the spec it implements, and the
// comments cite the section ("spec 2 step 4" = chapter 2, "allocate_slots as an algorithm", step 4).
//
// Structure:
//   Group and its subclasses  -- one KV-cache group per attention kind (spec 3, 5, 8): skipped tokens,
//                                hit search, cache mask, blocks to allocate, allocation, release plan.
//   Manager                   -- the request-level operations (spec 2), the coordinator's hit search and
//                                caching (spec 4, 6), external tokens (spec 7), refusals (spec 2 step 0).

import { Pool, Refusal, NULL_BLOCK, BASE_RELEASE, atLeast, isInt, requireCount } from "./pool.mjs";

const cdiv = (a, b) => -Math.floor(-a / b);
const fdiv = (a, b) => Math.floor(a / b);
const refuse = (kind, message) => { throw new Refusal(kind, message); };

export { atLeast }; // spec 9 "Releases" (pool.mjs)

// spec 1 "What a Stored event says": vLLM's name of each kind, carried by a manager's Stored events.
const SPEC_KIND = {
  FullAttentionSpec: "full_attention",
  RSWASpec: "full_attention",
  MLAAttentionSpec: "mla_attention",
  SlidingWindowSpec: "sliding_window",
  ChunkedLocalAttentionSpec: "chunked_local_attention",
  MambaSpec: "mamba",
  CrossAttentionSpec: "cross_attention",
};
const FULL_KINDS = new Set(["FullAttentionSpec", "MLAAttentionSpec", "RSWASpec"]); // spec 4 step 1: "full attention (MLA and R-SWA included)"

// ---------------------------------------------------------------------------------------------
// Groups (spec 3 "The kinds as formulas", spec 5, spec 8)
// ---------------------------------------------------------------------------------------------

// spec 3: the positions a later request is known to hit -- where a replay of the prompt resumes (the
// manager's replayBoundaries), and the end of a shared prefix where the caller stored one on the
// request (vLLM's scheduler from 0.26).
function reachableBoundaries(request, replay) {
  return request.shared_prefix_boundary ? [...replay, request.shared_prefix_boundary] : replay;
}

class Group {
  constructor(manager, id, spec, blockSize) {
    this.m = manager;
    this.pool = manager.pool;
    this.id = id;
    this.spec = spec;
    this.B = blockSize; // tokens per block as the manager counts them (spec 2 "Context parallelism")
    this.eagle = false; // set by the manager (spec 6)
    // Per-request state; kept in one object so that a refusal can restore it (spec Notation "Refusal").
    this.st = { tables: new Map(), numCached: new Map() };
  }

  get isFull() { return FULL_KINDS.has(this.spec.type); }

  table(reqId) { return this.st.tables.get(reqId); }

  // The request's hash of position i at this group's block size: the hash of its last hash block (spec 1 detail 3).
  hashAt(request, i) {
    const k = this.B / this.m.hashBlockSize;
    return request.block_hashes[(i + 1) * k - 1];
  }

  numHashes(request) { return fdiv(request.block_hashes.length, this.B / this.m.hashBlockSize); }

  // The oldest block cached under (hash of position i, g) for every member group g, or null (spec 1 detail 5).
  cachedAt(request, i, memberIds) {
    if (i >= this.numHashes(request)) return null;
    const hash = this.hashAt(request, i);
    const found = [];
    for (const g of memberIds) {
      const blocks = this.pool.table.get(Pool.key(hash, g));
      if (!blocks) return null;
      found.push(blocks[0]);
    }
    return found;
  }

  // spec 3 table, column "skipped tokens skip(n)"
  skippedTokens(_n) { return 0; }

  // spec 3 "Blocks to allocate", for T token slots.
  blocksToAllocate(reqId, T, _main, hits, total, cap) {
    let required = cdiv(T, this.B);
    if (cap) required = Math.min(required, this.maxBlocksPerRequest());
    const held = this.table(reqId)?.length ?? 0;
    if (this.st.numCached.has(reqId)) return Math.max(required - held, 0); // a running request
    const skipBlocks = fdiv(this.skippedTokens(total), this.B);
    const fresh = Math.max(required - Math.max(skipBlocks, hits.length + held), 0);
    const taken = hits.slice(Math.max(0, skipBlocks - held));
    return fresh + taken.filter((b) => b !== NULL_BLOCK && this.pool.ref[b] === 0).length;
  }

  // The most blocks one request ever holds (the full-sequence check's cap, spec 2 step 1 / spec 3).
  maxBlocksPerRequest() { return Infinity; }

  // spec 2 step 4 / spec 7: a new request takes its hits (those not skipped at local + external) ...
  takeHits(reqId, hits, numTotal) {
    if (this.st.numCached.has(reqId)) return; // a running request takes nothing here
    const skipBlocks = fdiv(this.skippedTokens(numTotal), this.B);
    const kept = hits.slice(skipBlocks);
    this.pool.touch({ block_ids: kept });
    const table = [...Array(skipBlocks).fill(NULL_BLOCK), ...kept]; // skipped hits are padded with null
    this.st.tables.set(reqId, table);
    this.st.numCached.set(reqId, table.length); // hits (skipped ones too) are cached already
  }

  // ... then, with external tokens, extends its table to cover local + external tokens unless every
  // external token lies in the skipped prefix (spec 2 step 4, spec 7).
  allocateExternal(reqId, local, external) {
    if (external <= 0) return;
    const numTotal = local + external;
    const skipped = this.skippedTokens(numTotal);
    if (Math.min(numTotal - skipped, external) <= 0) return;
    const table = this.table(reqId);
    const n = cdiv(numTotal, this.B) - table.length;
    if (n > 0) table.push(...this.pool.get_new_blocks({ num_blocks: n }));
  }

  // spec 2 step 5: new blocks up to T tokens; returns the blocks taken.
  allocateNewBlocks(reqId, T, _main) {
    const table = this.table(reqId);
    const n = cdiv(T, this.B) - table.length;
    if (n <= 0) return [];
    const blocks = this.pool.get_new_blocks({ num_blocks: n });
    table.push(...blocks);
    return blocks;
  }

  // spec 3 "Release plan": walking back from position skip(total) // B - 1, every position up to the
  // first that already holds the null block, freed in one call, tail first.
  removalPlan(reqId, total, _numPromptTokens) {
    const table = this.table(reqId);
    if (!table) return;
    const end = Math.min(fdiv(this.skippedTokens(total), this.B), table.length);
    this.releaseBackFrom(table, end - 1, 0);
  }

  releaseBackFrom(table, from, lowest) {
    const removed = [];
    for (let i = from; i >= lowest; i--) {
      if (table[i] === NULL_BLOCK) break;
      removed.push(table[i]);
      table[i] = NULL_BLOCK;
    }
    if (removed.length) this.pool.free_blocks({ block_ids: removed });
  }

  // spec 3 table, column "cache mask": over new full positions start .. end - 1 (null = all).
  cacheMask(_request, _start, _end) { return null; }

  // Cache the full blocks of the first numTokens tokens (spec 2 step 6; pool cache_full_blocks).
  cacheBlocks(request, numTokens) {
    const table = this.table(request.id) ?? []; // a table too short for the tokens: the pool refuses (spec 7)
    const numFull = fdiv(numTokens, this.B);
    const numCached = this.st.numCached.get(request.id) ?? 0;
    if (numCached >= numFull) return;
    const mask = this.cacheMask(request, numCached, numFull);
    this.pool.cache_full_blocks({ request, block_ids: table, num_cached_blocks: numCached, num_full_blocks: numFull,
                                  block_size: this.B, group_id: this.id, block_mask: mask });
    this.st.numCached.set(request.id, numFull);
    const keys = [];
    for (let i = numCached; i < numFull; i++) {
      if (table[i] !== NULL_BLOCK && (mask === null || mask[i - numCached])) keys.push(Pool.key(this.hashAt(request, i), this.id));
    }
    this.onCached(keys);
  }

  onCached(_keys) {}

  // spec 2 "free(request)": the table back tail first.
  free(reqId) {
    const table = this.table(reqId);
    if (table) this.pool.free_blocks({ block_ids: [...table].reverse() });
    this.st.tables.delete(reqId);
    this.st.numCached.delete(reqId);
  }
}

// spec 3: full attention, MLA -- skip nothing; the run of cached positions from 0.
class FullAttention extends Group {
  // spec 3 table, "hit search": the run of cached positions from 0, at most L // B; with EAGLE one
  // fewer; cut back to a multiple of A.
  findHit(request, maxLen, eagle, memberIds) {
    const hits = memberIds.map(() => []);
    for (let i = 0; i < fdiv(maxLen, this.B); i++) {
      const found = this.cachedAt(request, i, memberIds);
      if (!found) break;
      found.forEach((b, j) => hits[j].push(b));
    }
    if (eagle && hits[0].length) hits.forEach((h) => h.pop());
    return this.m.cutToAlignment(hits, this.B);
  }

  cacheBlocks(request, numTokens) {
    super.cacheBlocks(request, numTokens);
    partialTail(this, request, numTokens);
  }
}

// spec 9 "Partial tail entries" (0.26; boundary moved in 0.32): a full-attention group whose block
// holds several hash blocks also registers the prompt's last hash boundary, when it lies inside a block
// and within the tokens cached, as a partial entry of the block holding it (after the full blocks).
function partialTail(group, request, numTokens) {
  const H = group.m.hashBlockSize;
  if (!atLeast(group.m.release, "0.26.0") || group.B <= H) return;
  const P = request.num_prompt_tokens;
  const lastToken = atLeast(group.m.release, "0.32.0") && !group.eagle ? 1 : 0;
  const boundary = fdiv(P - lastToken, H) * H;
  if (boundary <= 0 || boundary % group.B === 0 || boundary > numTokens) return;
  const table = group.table(request.id);
  const pos = fdiv(boundary, group.B);
  if (!table || pos >= table.length) return;
  group.pool.cache_partial_block({ request, block_id: table[pos], num_tokens: boundary, group_id: group.id, block_size: group.B });
}

// spec 3: reference sliding window -- searched as full attention; releases the gap between the prompt
// and the window.
class ReferenceSlidingWindow extends FullAttention {
  // spec 3 "Release plan": positions cdiv(P, B) up to max(P, total - w_r) // B, walking back the same
  // way; without num_prompt_tokens it releases nothing.
  removalPlan(reqId, total, P) {
    const table = this.table(reqId);
    if (!table || P === undefined || P === null) return;
    const first = cdiv(P, this.B);
    const end = Math.min(fdiv(Math.max(P, total - this.spec.rswa_window), this.B), table.length);
    this.releaseBackFrom(table, end - 1, first);
  }
}

// spec 3: sliding window w.
class SlidingWindow extends Group {
  get w() { return this.spec.sliding_window; }

  skippedTokens(n) { return Math.max(0, n - this.w + 1); }

  // vLLM's per-request maximum of a window (not in the prose; see README "Where the prose was not enough").
  maxBlocksPerRequest() {
    return cdiv(Math.min(this.w - 1 + this.m.maxNumBatchedTokens, this.m.maxModelLen), this.B) + 1;
  }

  // spec 3 "Sliding window, hit search".
  findHit(request, maxLen, eagle, memberIds) {
    const A = this.m.hitAlignment;
    const B = this.B;
    const e = eagle ? 1 : 0;
    const k = Math.max(1, cdiv(this.w - 1, B) + e);
    const maxN = fdiv(maxLen, B);
    const aligned = (n) => B === A || (((eagle ? n - 1 : n) * B) % A === 0);
    const cached = [];
    for (let i = 0; i < maxN; i++) cached.push(this.cachedAt(request, i, memberIds));
    // (1) the largest aligned n >= k whose last k positions are all cached
    for (let n = maxN; n >= k; n--) {
      if (!aligned(n)) continue;
      let all = true;
      for (let i = n - k; i < n; i++) if (!cached[i]) { all = false; break; }
      if (!all) continue;
      const hits = memberIds.map((_, j) => [...Array(n - k).fill(NULL_BLOCK), ...cached.slice(n - k, n).map((f) => f[j])]);
      if (eagle) hits.forEach((h) => h.pop());
      return hits;
    }
    // (2) otherwise the largest aligned n no longer than the run of cached positions from 0
    let run = 0;
    while (run < maxN && cached[run]) run++;
    let n = run;
    while (n > 0 && !aligned(n)) n--;
    let hits = memberIds.map((_, j) => cached.slice(0, n).map((f) => f[j]));
    hits = this.m.cutToAlignment(hits, B);
    if (eagle && hits[0].length) {
      hits.forEach((h) => h.pop());
      hits = this.m.cutToAlignment(hits, B);
    }
    return hits;
  }

  // spec 3 "Sliding window, cache mask".
  cacheMask(request, start, end) {
    const B = this.B;
    const e = this.eagle ? 1 : 0;
    const need = cdiv(this.w - 1, B) + e;
    const shift = e;
    const R = this.m.retentionInterval;
    const per = R === null ? fdiv(this.m.A, B) : fdiv(R, B);
    const keep = (i) => {
      if (R === 0) return false;
      if (need >= per) return true;
      return i >= shift && (i - shift) % per >= per - need;
    };
    const tailEnds = reachableBoundaries(request, this.m.replayBoundaries(request)).map((b) => fdiv(fdiv(b, this.m.A) * this.m.A, B) + shift);
    const mask = [];
    for (let i = start; i < end; i++) {
      let k = keep(i);
      if (R !== null && tailEnds.some((t) => i >= t - need && i < t)) k = true;
      mask.push(k);
    }
    return mask;
  }
}

// spec 3: chunked local attention c.
class ChunkedLocal extends Group {
  get c() { return this.spec.attention_chunk_size; }

  skippedTokens(n) { return fdiv(n, this.c) * this.c; }

  maxBlocksPerRequest() {
    return cdiv(Math.min(this.c + this.m.maxNumBatchedTokens, this.m.maxModelLen), this.B);
  }

  // spec 3 table: null for every position before (L // c * c) // B, then the run of cached positions
  // from there, up to L // B.
  findHit(request, maxLen, eagle, memberIds) {
    const first = fdiv(fdiv(maxLen, this.c) * this.c, this.B);
    const hits = memberIds.map(() => Array(first).fill(NULL_BLOCK));
    for (let i = first; i < fdiv(maxLen, this.B); i++) {
      const found = this.cachedAt(request, i, memberIds);
      if (!found) break;
      found.forEach((b, j) => hits[j].push(b));
    }
    if (eagle && hits[0].length) hits.forEach((h) => h.pop());
    return hits;
  }
}

// spec 8: cross attention -- encoder blocks, allocated once, never hit, never cached.
class CrossAttention extends Group {
  findHit(_request, _maxLen, _eagle, memberIds) { return memberIds.map(() => []); }

  blocksToAllocate(reqId, _T, _main, _hits, _total, _cap) {
    const held = this.table(reqId)?.length ?? 0;
    return Math.max(cdiv(this.m.numEncoderTokens, this.B) - held, 0);
  }

  allocateExternal() {}

  allocateNewBlocks(reqId) {
    const table = this.table(reqId);
    const n = cdiv(this.m.numEncoderTokens, this.B) - table.length;
    if (n <= 0) return [];
    const blocks = this.pool.get_new_blocks({ num_blocks: n });
    table.push(...blocks);
    return blocks;
  }

  removalPlan() {}

  cacheBlocks() { refuse("ValueError", "cross attention is never cached (hash-map-consistency)"); }
}

// spec 5: Mamba state blocks.
class Mamba extends Group {
  constructor(...args) {
    super(...args);
    this.st.allocated = new Set(); // requests that allocated before (spec 5 formula 6, 7)
    this.st.lastState = new Map(); // request -> position of the previous running state (formula 7, 8)
    this.st.cachedThisStep = new Set(); // keys cached since new_step_starts (formula 3)
  }

  get s() { return this.spec.num_speculative_blocks ?? 0; }
  get mode() { return this.spec.mamba_cache_mode; }
  // spec 5: h = s in the base release; 0 from 0.26 (spec 9 delta processed-token-windows)
  get holdBack() { return atLeast(this.m.release, "0.26.0") ? 0 : this.s; }
  get align() { return this.mode === "align"; }

  // spec 5 formula 1
  skippedTokens(n) { return Math.max(0, n - 1); }

  // spec 5 formula 2: the largest n <= L // B (B != A: n * B a multiple of A) whose position n - 1 is
  // cached: n - 1 null entries and that state block.
  findHit(request, maxLen, _eagle, memberIds) {
    for (let n = fdiv(maxLen, this.B); n >= 1; n--) {
      if (this.B !== this.m.hitAlignment && (n * this.B) % this.m.hitAlignment !== 0) continue;
      const found = this.cachedAt(request, n - 1, memberIds);
      if (found) return memberIds.map((_, j) => [...Array(n - 1).fill(NULL_BLOCK), found[j]]);
    }
    return memberIds.map(() => []);
  }

  // spec 5 formula 3: a state cached this step cannot be taken.
  hitsStateCachedThisStep(request, hits) {
    if (!hits.length || hits[hits.length - 1] === NULL_BLOCK) return false;
    return this.st.cachedThisStep.has(Pool.key(this.hashAt(request, hits.length - 1), this.id));
  }

  blocksToAllocate(reqId, T, main, hits, total, cap) {
    if (this.m.currentRequest && this.hitsStateCachedThisStep(this.m.currentRequest, hits)) return this.m.numBlocks + 1;
    if (!this.align) return super.blocksToAllocate(reqId, T + this.s * this.B, main, hits, total, cap); // formula 5
    // formula 6
    const required = cdiv(main, this.B) + this.s;
    const held = this.table(reqId)?.length ?? 0;
    let d = required - hits.length - held;
    if (d > 0) d = this.st.allocated.has(reqId) ? 1 : 1 + this.s;
    return d + hits.filter((b) => b !== NULL_BLOCK && this.pool.ref[b] === 0).length;
  }

  allocateNewBlocks(reqId, T, main) {
    if (!this.align) return super.allocateNewBlocks(reqId, T + this.s * this.B, main); // formula 5
    // formula 7
    const table = this.table(reqId);
    const required = cdiv(main, this.B) + this.s;
    if (table.length >= required) return [];
    const before = table.length;
    const allocatedBefore = this.st.allocated.has(reqId);
    if (allocatedBefore) this.st.lastState.set(reqId, before - 1 - this.s);
    else if (before > 0) this.st.lastState.set(reqId, before - 1);
    const statePos = required - this.s - 1;
    while (table.length < statePos) table.push(NULL_BLOCK);
    if (allocatedBefore) {
      for (let i = before - this.s; i < before; i++) {
        if (i < statePos) {
          table.push(table[i]);
          table[i] = NULL_BLOCK;
        } else break;
      }
    }
    const n = required - table.length;
    if (n > 0) table.push(...this.pool.get_new_blocks({ num_blocks: n }));
    this.st.allocated.add(reqId);
    return table.slice(before);
  }

  // spec 5 formula 8
  removalPlan(reqId, total) {
    const table = this.table(reqId);
    if (!table) return;
    const t = Math.max(0, total - this.holdBack);
    if (this.align && atLeast(this.m.release, "0.30.0")) {
      // spec 9 delta mamba-retire-across-gaps: every state before the window, past null gaps, one call.
      const end = Math.min(fdiv(this.skippedTokens(t), this.B), table.length);
      const removed = [];
      for (let i = end - 1; i >= 0; i--) {
        if (table[i] !== NULL_BLOCK) { removed.push(table[i]); table[i] = NULL_BLOCK; }
      }
      if (removed.length) this.pool.free_blocks({ block_ids: removed });
    } else {
      super.removalPlan(reqId, t);
    }
    if (!this.align) return;
    const last = this.st.lastState.get(reqId);
    if (last !== undefined && last < cdiv(t, this.B) - 1 && table[last] !== NULL_BLOCK) {
      this.pool.free_blocks({ block_ids: [table[last]] });
      table[last] = NULL_BLOCK;
    }
  }

  // spec 5 formula 4
  cacheMask(request, start, end) {
    const R = this.m.retentionInterval;
    if (R === null) return null;
    const per = fdiv(R, this.B);
    const states = reachableBoundaries(request, this.m.replayBoundaries(request)).map((b) => fdiv(fdiv(b, this.m.A) * this.m.A, this.B) - 1);
    const mask = [];
    for (let i = start; i < end; i++) {
      let k;
      if (R === 0) k = false;
      else if (per <= 1) k = true;
      else k = (i + 1) % per === 0;
      mask.push(k || states.includes(i));
    }
    return mask;
  }

  onCached(keys) { for (const k of keys) this.st.cachedThisStep.add(k); } // formula 3: noted until new_step_starts

  // spec 9 delta mamba-boundary-remarked (0.32): the state at the prompt's last reusable boundary is keyed and
  // noted as cached this step again whenever caching reaches exactly that boundary; from 0.33 (delta
  // mamba-boundary-remark-fixed) only where the block's own key does not name that boundary (evicted while held).
  cacheBlocks(request, numTokens) {
    super.cacheBlocks(request, numTokens);
    if (this.align && atLeast(this.m.release, "0.32.0")) {
      this.remarkPromptBoundary(request, numTokens, atLeast(this.m.release, "0.33.0"));
    }
  }

  remarkPromptBoundary(request, numTokens, unkeyedOnly) {
    const H = this.m.hashBlockSize;
    const P = request.num_prompt_tokens;
    const boundary = Math.max(this.m.useEagle ? fdiv(P, H) * H - H : fdiv(P - 1, H) * H, 0);
    if (numTokens <= 0 || numTokens % H || numTokens !== boundary) return;
    const table = this.table(request.id);
    const pos = Math.ceil(numTokens / this.B) - 1;
    if (!table || pos >= table.length || table[pos] === NULL_BLOCK) return;
    if (unkeyedOnly && this.pool.tokensOf.get(table[pos]) === numTokens) return;
    const key = this.pool.cache_partial_block({ request, block_id: table[pos], num_tokens: numTokens, group_id: this.id,
                                                block_size: this.B });
    this.st.cachedThisStep.add(key.bytes);
  }

  newStepStarts() { this.st.cachedThisStep.clear(); }

  free(reqId) {
    super.free(reqId);
    this.st.allocated.delete(reqId);
    this.st.lastState.delete(reqId);
  }
}

const GROUP_CLASS = {
  FullAttentionSpec: FullAttention,
  MLAAttentionSpec: FullAttention,
  RSWASpec: ReferenceSlidingWindow,
  SlidingWindowSpec: SlidingWindow,
  ChunkedLocalAttentionSpec: ChunkedLocal,
  MambaSpec: Mamba,
  CrossAttentionSpec: CrossAttention,
};

// ---------------------------------------------------------------------------------------------
// The manager (spec 2), with its coordinator (spec 4, 6) and connector operations (spec 7)
// ---------------------------------------------------------------------------------------------

const requireInt = (v, what) => {
  if (!isInt(v)) refuse("TypeError", `${what} must be an int, got ${JSON.stringify(v)}`);
  return v;
};
const requireBool = (v, what) => {
  if (typeof v !== "boolean") refuse("TypeError", `${what} must be a bool, got ${JSON.stringify(v)}`);
  return v;
};

export class Manager {
  // spec 1 "A manager likewise refuses sizes that do not nest" (vectors manager/configs/*).
  constructor(config) {
    const {
      num_blocks, max_model_len, enable_caching, use_eagle = false, eagle_groups = [], enable_kv_cache_events,
      scheduler_block_size, hash_block_size, groups, retention_interval = null,
      dcp_world_size = 1, pcp_world_size = 1, max_num_batched_tokens = null, watermark = 0, release = BASE_RELEASE,
    } = config;
    this.release = release;
    for (const [v, what] of [[max_model_len, "max_model_len"], [scheduler_block_size, "scheduler_block_size"],
                             [hash_block_size, "hash_block_size"], [dcp_world_size, "dcp_world_size"],
                             [pcp_world_size, "pcp_world_size"]]) {
      requireInt(v, what);
      if (v < 1) refuse("ValueError", `${what} must be positive (block-size-coherence)`);
    }
    // spec 2 "Every refusal of the manager's constructor": the flags are bools, a given
    // max_num_batched_tokens a count.
    for (const [v, what] of [[enable_caching, "enable_caching"], [use_eagle, "use_eagle"],
                             [enable_kv_cache_events, "enable_kv_cache_events"]]) requireBool(v, what);
    if (max_num_batched_tokens !== null && requireInt(max_num_batched_tokens, "max_num_batched_tokens") < 0) {
      refuse("ValueError", "max_num_batched_tokens must be >= 0 (block-size-coherence)");
    }
    const sizes = this.contextParallelSizes(groups, dcp_world_size, pcp_world_size);
    for (const B of sizes) {
      if (scheduler_block_size % B) refuse("ValueError", "a group's block size does not divide the scheduler block size");
      if (enable_caching && B % hash_block_size) refuse("ValueError", "hash_block_size does not divide a group's block size");
    }
    if (scheduler_block_size % hash_block_size) refuse("ValueError", "hash_block_size does not divide the scheduler block size");
    // spec 3: a retention interval is None, 0 or a multiple of the scheduler block size, only with a
    // sliding-window or Mamba group.
    if (retention_interval !== null) {
      requireInt(retention_interval, "retention_interval");
      if (retention_interval < 0 || retention_interval % scheduler_block_size) refuse("ValueError", "bad retention interval");
      if (!groups.some((g) => ["SlidingWindowSpec", "MambaSpec"].includes(g.type))) refuse("ValueError", "a retention interval needs a sliding-window or Mamba group");
    }
    this.pool = new Pool({ num_blocks, enable_caching, hash_block_size, enable_kv_cache_events, release });
    this.numBlocks = num_blocks;
    this.maxModelLen = max_model_len;
    this.caching = enable_caching;
    this.A = scheduler_block_size;
    this.hashBlockSize = hash_block_size;
    // spec 9 delta unrounded-caching-under-dcp (0.29): decode ranks and a Mamba align block >= the hash block.
    this.cachesUnrounded = atLeast(release, "0.29.0") && dcp_world_size > 1 && groups.some(
      (g) => g.type === "MambaSpec" && g.mamba_cache_mode === "align" && g.block_size >= hash_block_size);
    this.retentionInterval = retention_interval;
    this.maxNumBatchedTokens = max_num_batched_tokens ?? max_model_len;
    // spec 2 step 3: the watermark is watermark * num_blocks blocks, rounded down.
    if (typeof watermark !== "number" || !Number.isFinite(watermark) || watermark < 0) refuse("ValueError", "watermark must be a finite number >= 0 (allocation-accounting)");
    this.watermarkBlocks = Math.floor(watermark * num_blocks);
    this.groups = groups.map((spec, id) => new (GROUP_CLASS[spec.type])(this, id, spec, sizes[id]));
    this.useEagle = use_eagle; // spec 9 mamba-boundary-remarked: the boundary with a drafter
    this.markEagleGroups(use_eagle, eagle_groups);
    this.withDrafter = use_eagle || eagle_groups.length > 0; // has_drafter (spec 9, eagle-replay-boundaries)
    this.specGroups = this.buildSpecGroups();
    if (enable_caching) this.refuseUncacheableLayout(sizes);
  }

  // spec 2 "Every refusal of the manager's constructor", the rows with caching on.
  refuseUncacheableLayout(sizes) {
    const types = this.groups.map((g) => g.spec.type);
    if (types.includes("CrossAttentionSpec")) refuse("ValueError", "cross attention is never cached (hash-map-consistency)");
    if (this.groups.some((g) => g.spec.type === "ChunkedLocalAttentionSpec" && g.eagle)) {
      refuse("ValueError", "a chunked-local group cannot be an EAGLE group (hit-soundness)");
    }
    if (this.groups.length === 1 && sizes[0] !== this.hashBlockSize) {
      refuse("ValueError", "one group's block size must be the hash block size (block-size-coherence)");
    }
    if (this.groups.length > 1) {
      if (this.specGroups.length < 2) refuse("ValueError", "a hybrid needs two distinct specs (hit-soundness)");
      if (this.groups.some((g, i) => g.spec.type === "ChunkedLocalAttentionSpec" && sizes[i] !== this.A)) {
        refuse("ValueError", "a chunked-local block must be the scheduler block (block-size-coherence)");
      }
    }
  }

  // spec 3 replay_boundaries: P - 1; from 0.30 (spec 9 delta eagle-replay-boundaries), with a drafter,
  // max(R - A, 0) and max(E - A, 0) for R = (P - 1) // A * A and E = P // A * A.
  replayBoundaries(request) {
    const P = request.num_prompt_tokens;
    if (!(this.withDrafter && atLeast(this.release, "0.30.0"))) return [P - 1];
    const resend = fdiv(P - 1, this.A) * this.A, sibling = fdiv(P, this.A) * this.A;
    return [...new Set([Math.max(resend - this.A, 0), Math.max(sibling - this.A, 0)])].sort((a, b) => a - b);
  }

  // spec 2 "Context parallelism": a block holds block_size * ranks tokens; only a model of one group
  // that keeps every block may be split.  spec 9 (0.26): pcp-outside-the-block (a block holds
  // block_size * dcp tokens) and dcp-on-hybrid-models (full attention + Mamba hybrids take decode
  // ranks; Mamba blocks keep block_size).
  contextParallelSizes(groups, dcp, pcp) {
    const keepsEveryBlock = ["FullAttentionSpec", "MLAAttentionSpec", "RSWASpec", "CrossAttentionSpec"];
    const since026 = atLeast(this.release, "0.26.0");
    const ranks = since026 ? dcp : dcp * pcp;
    const single = groups.length === 1 && keepsEveryBlock.includes(groups[0].type);
    const hybridOk = since026 && groups.length > 1 && pcp === 1 &&
      groups.every((g) => ["FullAttentionSpec", "MLAAttentionSpec", "MambaSpec"].includes(g.type));
    if (dcp * pcp > 1 && !single && !hybridOk) {
      refuse("ValueError", "context parallelism needs one group that keeps every block (block-size-coherence)");
    }
    return groups.map((g) => {
      requireInt(g.block_size, "block_size");
      if (g.block_size < 1) refuse("ValueError", "block sizes must be positive");
      return g.type === "MambaSpec" ? g.block_size : g.block_size * ranks;
    });
  }

  // spec 6: those the config marks, or all when EAGLE is on and none is marked; never a Mamba group;
  // groups with equal specs share the mark.
  markEagleGroups(useEagle, marked) {
    // From 0.33 (spec 9 delta eagle-drop-needs-use-eagle) the marks alone drop nothing.
    if (!useEagle && (!marked.length || atLeast(this.release, "0.33.0"))) return;
    const ids = marked.length ? marked : this.groups.map((g) => g.id);
    const specs = ids.map((i) => JSON.stringify(this.groups[i].spec));
    for (const g of this.groups) {
      if (g.spec.type === "MambaSpec") continue;
      if (ids.includes(g.id) || specs.includes(JSON.stringify(g.spec))) g.eagle = true;
    }
  }

  // spec 4 step 1: spec groups (equal whole specs), EAGLE if any member is, full attention first (stable).
  buildSpecGroups() {
    const sgs = [];
    for (const g of this.groups) {
      const key = JSON.stringify(g.spec);
      const sg = sgs.find((s) => s.key === key);
      if (sg) sg.members.push(g);
      else sgs.push({ key, members: [g] });
    }
    for (const sg of sgs) {
      sg.head = sg.members[0];
      sg.eagle = sg.members.some((g) => g.eagle);
      sg.ids = sg.members.map((g) => g.id);
    }
    return [...sgs.filter((s) => s.head.isFull), ...sgs.filter((s) => !s.head.isFull)];
  }

  // spec 4: hits are aligned to A in a hybrid, to the group's own B with one group (UnitaryCoordinator).
  get hitAlignment() { return this.groups.length === 1 ? this.groups[0].B : this.A; }

  // "cut back to a multiple of A" (spec 3 table, hit search).
  cutToAlignment(hits, B) {
    let n = hits[0].length;
    while (n > 0 && (n * B) % this.hitAlignment !== 0) n--;
    return hits.map((h) => h.slice(0, n));
  }

  // --- snapshots: a refusal changes nothing (spec Notation "Refusal") ---

  snapshot() {
    const p = this.pool;
    return structuredClone({ pool: { ref: p.ref, free: p.free, keyOf: p.keyOf, tokensOf: p.tokensOf, partialOf: p.partialOf, table: p.table, events: p.events },
                             groups: this.groups.map((g) => g.st) });
  }

  restore(snap) {
    Object.assign(this.pool, snap.pool);
    this.groups.forEach((g, i) => { g.st = snap.groups[i]; });
  }

  atomic(fn) {
    const snap = this.snapshot();
    try {
      return fn();
    } catch (error) {
      if (error instanceof Refusal) this.restore(snap);
      throw error;
    } finally {
      this.currentRequest = null;
    }
  }

  // ---- get_computed_blocks (spec 2 "the hit", spec 4) ----

  get_computed_blocks({ request }) {
    const none = [this.groups.map(() => []), 0];
    if (!this.caching || request.skip_reading_prefix_cache) return none; // NoPrefixCacheCoordinator
    const [hits, length] = this.findLongestCacheHit(request);
    return [hits, length];
  }

  // spec 4 "The fixed point as an algorithm" (UnitaryCoordinator for one group).
  findLongestCacheHit(request) {
    const L = request.num_tokens - 1;
    if (this.groups.length === 1) {
      const g = this.groups[0];
      const [hit] = g.findHit(request, L, g.eagle, [g.id]);
      return [[hit], hit.length * g.B];
    }
    const hits = this.groups.map(() => []);
    const sgs = this.specGroups;
    let hit = L; // step 2
    const verified = new Set();
    const simple = sgs.length === 2 && sgs[0].head.isFull;
    const searched = new Set();
    for (;;) {
      // step 3: a pass
      let length = hit;
      for (const sg of sgs) {
        const B = sg.head.B;
        if (sg.head.isFull && searched.has(sg)) {
          length = fdiv(length, B) * B;
          continue;
        }
        const drop = sg.eagle && !verified.has(sg);
        const max = drop ? Math.min(length + B, this.eaglePeek(request)) : length;
        const result = sg.head.findHit(request, max, drop, sg.ids);
        searched.add(sg);
        const found = result[0].length * B;
        if (drop) verified.add(sg);
        else if (found < length) verified.clear();
        length = found;
        sg.ids.forEach((id, j) => { hits[id] = result[j]; });
      }
      // step 4
      if (length >= hit) break;
      hit = length;
      if (simple) break;
    }
    // step 5: cut every full-attention group's hit to hit // B blocks
    for (const g of this.groups) if (g.isFull) hits[g.id] = hits[g.id].slice(0, fdiv(hit, g.B));
    return [hits, hit];
  }

  // spec 4 step 3: peek = L in the base release; from 0.32 the request's hashed tokens (spec 9
  // delta eagle-lookahead-hashes: the end of its last full hash block).
  eaglePeek(request) {
    if (atLeast(this.release, "0.32.0")) return request.block_hashes.length * this.hashBlockSize;
    return request.num_tokens - 1;
  }

  // ---- allocate_slots (spec 2 "allocate_slots as an algorithm") ----

  allocate_slots(args) {
    return this.atomic(() => this.allocateSlots(args));
  }

  // The algorithm, one method per step; `c` carries the call's names (spec 2: computed, hits, external,
  // new, lookahead, M) between the steps.
  allocateSlots(args) {
    const c = this.refuseBadAllocation(args); // step 0
    this.numEncoderTokens = c.encoder;
    this.currentRequest = c.request;
    if (!this.fullSequenceFits(c)) return null; // step 1
    this.releaseOutOfWindow(c); // step 2
    if (!this.capacitySuffices(c)) return null; // step 3
    // spec 5 note (F5): the capacity check keeps vLLM's estimate, which can miss a block (Mamba align
    // with external tokens); where the pool then runs short the allocation answers None and changes
    // nothing past step 2 (inferred from vector manager/findings/F5: the prose says "refuses").
    const afterRelease = this.snapshot();
    let taken;
    try {
      this.takeHitsThenExternal(c); // step 4
      taken = this.allocateNewBlocks(c); // step 5
    } catch (error) {
      if (!(error instanceof Refusal)) throw error;
      this.restore(afterRelease);
      return null;
    }
    this.cacheFullBlocks(c); // step 6
    return taken; // step 7: the blocks taken in step 5 only, one list per group
  }

  // spec 2 step 0: refuse (raise, nothing changes) on bad counts and flags, an empty allocation, a
  // length past M, a hit the request may not take, a hit block no longer cached.
  refuseBadAllocation({ request, num_new_tokens, num_new_computed_tokens = 0, new_computed_blocks = null,
                        num_lookahead_tokens = 0, num_external_computed_tokens = 0, delay_cache_blocks = false,
                        num_encoder_tokens = 0, full_sequence_must_fit = false, reserved_blocks = 0,
                        has_scheduled_reqs = true }) {
    const c = {
      request,
      id: request.id,
      M: this.maxModelLen,
      computed: requireCount(request.num_computed_tokens, "num_computed_tokens"),
      newTokens: requireCount(num_new_tokens, "num_new_tokens"),
      hits: requireCount(num_new_computed_tokens, "num_new_computed_tokens"),
      lookahead: requireCount(num_lookahead_tokens, "num_lookahead_tokens"),
      external: requireCount(num_external_computed_tokens, "num_external_computed_tokens"),
      encoder: requireCount(num_encoder_tokens, "num_encoder_tokens"),
      delayCache: requireBool(delay_cache_blocks, "delay_cache_blocks"),
      mustFit: requireBool(full_sequence_must_fit, "full_sequence_must_fit"),
      reserved: requireCount(reserved_blocks, "reserved_blocks"),
      // spec 2 step 3: the watermark applies to a waiting or preempted request while others are scheduled.
      watermark: requireBool(has_scheduled_reqs, "has_scheduled_reqs") &&
        ["WAITING", "PREEMPTED"].includes(request.status) ? this.watermarkBlocks : 0,
      running: this.groups.some((g) => g.st.numCached.has(request.id)),
    };
    // Checks 2 to 5, in the prose's order (the first that applies decides the error's kind).
    // From 0.31 (spec 9 delta zero-token-hit-adoption) a call that adopts a local hit needs no new tokens.
    const adoptsHit = c.hits > 0 && atLeast(this.release, "0.31.0");
    if (c.newTokens === 0 && c.external === 0 && !adoptsHit) refuse("ValueError", "nothing to allocate (allocation-accounting)");
    c.hitBlocks = this.requireHitLists(new_computed_blocks);
    const anyHit = c.hitBlocks.some((h) => h.length); // the blocks decide: the count is trusted
    if (anyHit && c.running) refuse("ValueError", "hits for a running request (hit-soundness)");
    if (anyHit && !this.caching) refuse("ValueError", "hits with caching off (hit-soundness)");
    this.groups.forEach((g, gi) => {
      if (g instanceof CrossAttention && c.hitBlocks[gi].length) refuse("ValueError", "a hit on cross attention (hit-soundness)");
      c.hitBlocks[gi].forEach((b, i) => {
        if (b === NULL_BLOCK) return;
        const key = i < g.numHashes(request) ? Pool.key(g.hashAt(request, i), g.id) : null;
        if (!key || !(this.pool.table.get(key) ?? []).includes(b)) refuse("ValueError", `hit block ${b} no longer cached (content-soundness)`);
      });
    });
    if (c.computed + c.hits + c.external + c.newTokens > c.M) refuse("ValueError", "past max_model_len (allocation-accounting)");
    c.local = c.computed + c.hits; // step 1 (a running request's external tokens count here too)
    c.total = Math.min(c.local + c.external, c.M);
    c.slots = Math.min(c.total + c.newTokens + c.lookahead, c.M); // step 3, 5
    c.main = c.total + c.newTokens; // spec 5 formula 6: the tokens without lookahead
    return c;
  }

  // spec 2 step 0, check 3: one list of block ids per group, each id an int inside the pool.
  requireHitLists(lists) {
    if (lists === null || lists === undefined) return this.groups.map(() => []);
    if (!Array.isArray(lists) || !lists.every(Array.isArray)) refuse("TypeError", "new_computed_blocks: not a list of lists (hit-soundness)");
    if (lists.length !== this.groups.length) refuse("ValueError", `new_computed_blocks: ${lists.length} lists for ${this.groups.length} groups (hit-soundness)`);
    for (const b of lists.flat()) this.pool.requireBlock(b);
    return lists;
  }

  // spec 2 step 1: with full_sequence_must_fit, the blocks the whole request needs (min(num_tokens, M)
  // tokens, a window or chunk at its per-request maximum) must not exceed the free count.
  fullSequenceFits(c) {
    if (!c.mustFit || this.trial) return true;
    const T = Math.min(c.request.num_tokens, c.M);
    const need = this.groups.reduce((n, g, gi) => n + g.blocksToAllocate(c.id, T, T, c.hitBlocks[gi], c.total, true), 0);
    return need + c.watermark <= this.pool.free.length;
  }

  // spec 2 step 2: release, in every group, the blocks that left its window at total (kept whatever follows).
  releaseOutOfWindow(c) {
    for (const g of this.groups) g.removalPlan(c.id, c.total, c.request.num_prompt_tokens);
  }

  // spec 2 step 3: need = the blocks to allocate for min(total + new + lookahead, M) tokens, summed
  // over the groups; None if need + the watermark is more than the free count less reserved_blocks.
  capacitySuffices(c) {
    if (this.trial) return true;
    const need = this.groups.reduce((n, g, gi) => n + g.blocksToAllocate(c.id, c.slots, c.main, c.hitBlocks[gi], c.total), 0);
    return need + c.watermark <= this.pool.free.length - c.reserved;
  }

  // spec 2 step 4, spec 7: a new request takes its hits in every group first, then each group takes
  // blocks for the external tokens.
  takeHitsThenExternal(c) {
    this.groups.forEach((g, gi) => g.takeHits(c.id, c.hitBlocks[gi], c.local + c.external));
    for (const g of this.groups) g.allocateExternal(c.id, c.local, c.running ? 0 : c.external);
  }

  // spec 2 step 5: each group takes new blocks up to min(total + new + lookahead, M) tokens.
  allocateNewBlocks(c) {
    return this.groups.map((g) => g.allocateNewBlocks(c.id, c.slots, c.main));
  }

  // spec 2 step 6: unless caching is off or delayed, cache the full blocks of min(total + new, num_tokens) tokens.
  cacheFullBlocks(c) {
    if (this.caching && !c.delayCache) this.cache(c.request, Math.min(c.total + c.newTokens, c.request.num_tokens));
  }

  // spec 4 "Caching in a hybrid": n // A * A tokens; an EAGLE group min(n, n // A * A + B).  spec 9
  // unrounded-caching-under-dcp: n, not rounded.
  cache(request, n) {
    if (this.groups.length === 1) {
      this.groups[0].cacheBlocks(request, n);
      return;
    }
    const aligned = this.cachesUnrounded ? n : fdiv(n, this.A) * this.A;
    for (const g of this.groups) {
      if (g instanceof CrossAttention) continue;
      g.cacheBlocks(request, g.eagle && aligned > 0 ? Math.min(n, aligned + g.B) : aligned);
    }
  }

  // ---- the other operations ----

  // spec 2 "free(request)": group by group in group-id order, each table tail first.
  free({ request }) {
    return this.atomic(() => {
      for (const g of this.groups) g.free(request.id);
      return null;
    });
  }

  // spec 3: remove_skipped_blocks -- every group's release plan at total_computed_tokens (R-SWA reads
  // num_prompt_tokens, and releases nothing without it).
  remove_skipped_blocks({ request_id, total_computed_tokens, num_prompt_tokens = null }) {
    return this.atomic(() => {
      requireCount(total_computed_tokens, "total_computed_tokens");
      for (const g of this.groups) g.removalPlan(request_id, total_computed_tokens, num_prompt_tokens);
      return null;
    });
  }

  // spec 7 "An asynchronous load": cache the full blocks of the first n tokens.
  cache_blocks({ request, num_computed_tokens }) {
    return this.atomic(() => {
      requireCount(num_computed_tokens, "num_computed_tokens");
      if (num_computed_tokens > request.num_tokens) refuse("ValueError", "more tokens than the request has (content-soundness)");
      if (!this.caching) return null;
      this.cache(request, num_computed_tokens);
      return null;
    });
  }

  get_block_ids({ request_id }) {
    return this.groups.map((g) => [...(g.table(request_id) ?? [])]);
  }

  // spec 5: a state cached in this step can be hit from the next one.
  new_step_starts() {
    for (const g of this.groups) if (g instanceof Mamba) g.newStepStarts();
    return null;
  }

  evict_blocks(args) { return this.atomic(() => this.pool.evict_blocks(args)); }

  reset_prefix_cache() { return this.atomic(() => this.pool.reset_prefix_cache()); }

  // ---- what the manager reports about itself (spec 2, spec 7) ----

  // spec 2: get_usage() is the pool's.
  get_usage() { return this.pool.get_usage(); }

  // spec 2: how many free blocks allocate_slots with the same arguments takes -- a trial run on a copy
  // (hits taken out of the free queue count, new blocks count; nothing is cached, nothing kept).
  get_num_blocks_to_allocate(args) {
    const snap = this.snapshot();
    const pool = this.pool;
    const { get_new_blocks: take, touch } = pool;
    let pulled = 0;
    let fake = this.numBlocks;
    pool.get_new_blocks = ({ num_blocks }) => {
      pulled += num_blocks;
      return Array.from({ length: num_blocks }, () => fake++);
    };
    pool.touch = ({ block_ids }) => {
      for (const b of new Set(block_ids)) if (b !== NULL_BLOCK && pool.ref[b] === 0) pulled += 1;
    };
    try {
      this.trial = true;
      this.allocateSlots({ ...args, delay_cache_blocks: true });
      return pulled;
    } finally {
      this.trial = false;
      pool.get_new_blocks = take;
      pool.touch = touch;
      this.restore(snap);
    }
  }

  // spec 2 "get_num_common_prefix_blocks": full attention counts the leading blocks whose reference
  // count equals the number of requests holding tables; the other kinds answer 0.
  get_num_common_prefix_blocks({ running_request_id: request_id }) {
    const holders = this.state().tables;
    const n = Object.keys(holders).length;
    return this.groups.map((g) => {
      if (!g.isFull) return 0;
      let count = 0;
      for (const b of g.table(request_id) ?? []) {
        if (b === NULL_BLOCK || this.pool.ref[b] !== n) break;
        count += 1;
      }
      return count;
    });
  }

  // spec 7 "Saving a finished request": the first cdiv(n, B) blocks per attention group, the whole
  // table for cross attention and Mamba; n an int >= 0.
  get_block_ids_for_computed_tokens({ request_id, num_computed_tokens }) {
    requireCount(num_computed_tokens, "num_computed_tokens");
    return this.groups.map((g) => {
      const table = g.table(request_id) ?? [];
      const whole = g instanceof Mamba || g instanceof CrossAttention;
      return whole ? [...table] : table.slice(0, cdiv(num_computed_tokens, g.B));
    });
  }

  // spec 7 "Per-group hits": null unless several groups and caching on; else each spec group's own
  // search, once, with maximum M = num_tokens - 1 (from 0.32, an EAGLE spec group's min(M + B, hashed
  // tokens)), alignment A, its EAGLE drop; every member gets the hit and len(hit) * B.
  find_longest_cache_hit_per_group({ request }) {
    if (!this.caching || this.groups.length < 2) return null;
    const M = request.num_tokens - 1;
    const hits = this.groups.map(() => []);
    const lengths = this.groups.map(() => 0);
    for (const sg of this.specGroups) {
      const B = sg.head.B;
      const max = sg.eagle ? Math.min(M + B, this.eaglePeek(request)) : M; // the base's peek is M itself
      const result = sg.head.findHit(request, max, sg.eagle, sg.ids);
      sg.ids.forEach((id, j) => { hits[id] = result[j]; lengths[id] = result[0].length * B; });
    }
    return [hits, lengths];
  }

  // spec 1 "What a Stored event says": a manager's Stored events also name the group's kind and its
  // sliding window, if it has one.
  takeEvents() {
    return this.pool.events.splice(0).map((e) => {
      if (e.event !== "stored") return e;
      const spec = this.groups[e.group].spec;
      const out = { ...e, spec_kind: SPEC_KIND[spec.type] };
      if (spec.sliding_window !== undefined && spec.sliding_window !== null) out.sliding_window = spec.sliding_window;
      return out;
    });
  }

  state() {
    const tables = {};
    const ids = new Set();
    for (const g of this.groups) for (const id of g.st.tables.keys()) ids.add(id);
    for (const id of [...ids].sort()) tables[id] = this.groups.map((g) => [...(g.table(id) ?? [])]);
    return { ...this.pool.state(), tables };
  }
}
