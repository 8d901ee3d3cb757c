// The block pool of spec chapter 1 ("The pool"), in JavaScript, from the prose alone.
//
// Moved here from replay.mjs (unchanged but for the exports and the prompt-embedding extra key of
// spec 1.1 step 3) so that manager.mjs can drive it.  Every operation is atomic: a refusal (class
// Refusal, kind "ValueError" or "TypeError") changes nothing.

import { createHash } from "node:crypto";

export const NULL_BLOCK = 0;

// spec 9 "Releases": a vector names the vLLM release whose rules it was derived under (absent: the base).
export const BASE_RELEASE = "0.25.1";
const releaseKey = (r) => r.split(".").map((x) => x.padStart(4, "0")).join(".");
export const atLeast = (release, r) => releaseKey(release) >= releaseKey(r);
const GROUP_ID_BYTES = 4;
const MAX_GROUP_ID = 2 ** (8 * GROUP_ID_BYTES) - 1;

export class Refusal extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind; // "ValueError" or "TypeError", as the vectors record refusals
  }
}

export const isInt = (v) => typeof v === "number" && Number.isInteger(v);
const isBytes = (v) => v !== null && typeof v === "object" && typeof v.bytes === "string";

export function requireCount(n, what) {
  if (!isInt(n)) throw new Refusal("TypeError", `${what} must be an int, got ${JSON.stringify(n)}`);
  if (n < 0) throw new Refusal("ValueError", `${what} must be >= 0, got ${n}`);
  return n;
}

// A hash's form in events: the low 64 bits of the big-endian integer,
// written as a JSON number when JavaScript can hold it exactly.
export function eventHash(hex) {
  const value = BigInt("0x" + hex.slice(-16));
  return value < 2n ** 53n ? Number(value) : { int: value.toString() };
}

export class Pool {
  constructor({ num_blocks, enable_caching, hash_block_size, enable_kv_cache_events, release = BASE_RELEASE }) {
    requireCount(num_blocks, "num_blocks");
    if (num_blocks < 1) throw new Refusal("ValueError", "a pool needs at least the null block");
    requireCount(hash_block_size, "hash_block_size");
    if (hash_block_size < 1) throw new Refusal("ValueError", "hash_block_size must be >= 1");
    this.numBlocks = num_blocks;
    this.caching = enable_caching;
    this.hashBlockSize = hash_block_size;
    this.eventsOn = enable_kv_cache_events;
    this.release = release;
    this.ref = new Array(num_blocks).fill(0);
    this.free = Array.from({ length: num_blocks - 1 }, (_, i) => i + 1); // head first; block 0 is the null block
    this.keyOf = new Map(); // block -> key (hash hex + group as 4 big-endian bytes)
    this.tokensOf = new Map(); // block -> the prefix length its own key names
    this.partialOf = new Map(); // block -> further keys it owns (prefixes ending inside it)
    this.table = new Map(); // key -> blocks, oldest first
    this.events = [];
  }

  requireBlock(id) {
    if (!isInt(id)) throw new Refusal("TypeError", `block id must be an int, got ${JSON.stringify(id)}`);
    if (id < 0 || id >= this.numBlocks) throw new Refusal("ValueError", `block id ${id} is outside the pool`);
    return id;
  }

  static requireGroup(g) {
    if (!isInt(g)) throw new Refusal("TypeError", `group id must be an int, got ${JSON.stringify(g)}`);
    if (g < 0 || g > MAX_GROUP_ID) throw new Refusal("ValueError", `group id ${g} does not fit in 4 bytes`);
    return g;
  }

  static key(hashHex, group) {
    return hashHex + group.toString(16).padStart(2 * GROUP_ID_BYTES, "0");
  }

  // Every key of the block leaves the table -- its own, then its partial entries.
  evict(block) {
    const key = this.keyOf.get(block);
    if (key === undefined) return;
    const keys = [key, ...(this.partialOf.get(block) ?? [])];
    this.keyOf.delete(block);
    this.tokensOf.delete(block);
    this.partialOf.delete(block);
    for (const k of keys) {
      const blocks = this.table.get(k).filter((b) => b !== block);
      if (blocks.length) this.table.set(k, blocks);
      else this.table.delete(k);
      if (this.eventsOn) {
        const hashHex = k.slice(0, -2 * GROUP_ID_BYTES);
        const group = parseInt(k.slice(-2 * GROUP_ID_BYTES), 16);
        this.events.push({ event: "removed", group, block_hash: eventHash(hashHex) });
      }
    }
  }

  // The key becomes the block's own (naming a prefix of `tokens` tokens), or a partial entry if it has one.
  insert(block, key, tokens) {
    if (this.keyOf.has(block)) this.partialOf.set(block, [...(this.partialOf.get(block) ?? []), key]);
    else {
      this.keyOf.set(block, key);
      this.tokensOf.set(block, tokens);
    }
    this.table.set(key, [...(this.table.get(key) ?? []), block]);
  }

  // --- operations (each refusal leaves the pool unchanged) ---

  get_new_blocks({ num_blocks }) {
    requireCount(num_blocks, "block count");
    if (num_blocks > this.free.length) throw new Refusal("ValueError", `only ${this.free.length} blocks are free`);
    const taken = this.free.splice(0, num_blocks);
    for (const b of taken) {
      this.evict(b); // a cached block being reused loses its key first
      this.ref[b] = 1;
    }
    return taken;
  }

  touch({ block_ids }) {
    const ids = block_ids.map((b) => this.requireBlock(b));
    for (const b of ids) {
      if (b === NULL_BLOCK) continue;
      if (this.ref[b] === 0) this.free.splice(this.free.indexOf(b), 1);
      this.ref[b] += 1;
    }
    return null;
  }

  free_blocks({ block_ids }) {
    const ids = block_ids.map((b) => this.requireBlock(b));
    const drops = new Map();
    for (const b of ids) if (b !== NULL_BLOCK) drops.set(b, (drops.get(b) ?? 0) + 1);
    for (const [b, n] of drops) {
      if (n > this.ref[b]) throw new Refusal("ValueError", `block ${b} freed ${n} times, held ${this.ref[b]}`);
    }
    const plain = [];
    const cached = [];
    for (const b of ids) {
      if (b === NULL_BLOCK) continue;
      this.ref[b] -= 1;
      if (this.ref[b] === 0) (this.keyOf.has(b) ? cached : plain).push(b);
    }
    if (!this.caching && atLeast(this.release, "0.27.0") && !atLeast(this.release, "0.28.0")) {
      // spec 9 free-order-without-caching (0.27), undone by free-order-restored (0.28): all to the tail
      this.free = [...this.free, ...plain, ...cached];
    } else {
      this.free = [...plain, ...this.free, ...cached]; // no key: reused first; cached: least recently used first
    }
    return null;
  }

  get_cached_block({ block_hash, group_ids }) {
    if (!isBytes(block_hash)) throw new Refusal("TypeError", "block hash must be bytes");
    const hits = [];
    for (const g of group_ids) {
      const blocks = this.table.get(Pool.key(block_hash.bytes, Pool.requireGroup(g)));
      if (!blocks) return null;
      hits.push(blocks[0]);
    }
    return hits;
  }

  cache_full_blocks({ request, block_ids, num_cached_blocks, num_full_blocks, block_size, group_id, block_mask = null }) {
    if (!this.caching) throw new Refusal("ValueError", "prefix caching is disabled on this pool");
    Pool.requireGroup(group_id);
    requireCount(block_size, "block_size");
    if (block_size === 0 || block_size % this.hashBlockSize) throw new Refusal("ValueError", "block size incoherent");
    requireCount(num_cached_blocks, "num_cached_blocks");
    requireCount(num_full_blocks, "num_full_blocks");
    if (num_cached_blocks >= num_full_blocks) return null;
    if (num_full_blocks > block_ids.length) throw new Refusal("ValueError", "more full blocks than blocks");
    // Block i at this block size is named by fine hash (i + 1) * scale - 1.
    const scale = block_size / this.hashBlockSize;
    const fine = request.block_hashes;
    const hashes = Array.from({ length: Math.floor(fine.length / scale) }, (_, i) => fine[(i + 1) * scale - 1]);
    if (hashes.length < num_full_blocks) throw new Refusal("ValueError", "too few hashes");
    const fresh = Array.from({ length: num_full_blocks - num_cached_blocks }, (_, j) => num_cached_blocks + j);
    if (block_mask !== null && block_mask.length !== fresh.length) throw new Refusal("ValueError", "mask length");
    const chosen = fresh.filter((i, j) => this.requireBlock(block_ids[i]) !== NULL_BLOCK && (block_mask === null || block_mask[j]));
    for (const i of chosen) {
      const b = block_ids[i];
      if (this.ref[b] <= 0) throw new Refusal("ValueError", `block ${b} is cached but nobody holds it`);
      // a block may already carry a key only when it is a partial entry of this very block (it is promoted)
      const t = this.tokensOf.get(b);
      if (this.keyOf.has(b) && !(i * block_size < t && t < (i + 1) * block_size)) {
        throw new Refusal("ValueError", `block ${b} already carries a hash`);
      }
    }
    if (new Set(chosen.map((i) => block_ids[i])).size !== chosen.length) throw new Refusal("ValueError", "aliasing");
    for (const i of chosen) {
      this.evict(block_ids[i]);
      this.insert(block_ids[i], Pool.key(hashes[i], group_id), (i + 1) * block_size);
    }
    if (this.eventsOn) this.events.push(storedEvent(request, hashes, fresh, chosen, block_size, group_id));
    return null;
  }

  // A partial entry: the block serves a prefix of num_tokens tokens that ends inside it.
  cache_partial_block({ request, block_id, num_tokens, group_id, block_size }) {
    if (this.requireBlock(block_id) === NULL_BLOCK) return null;
    Pool.requireGroup(group_id);
    requireCount(block_size, "block_size");
    requireCount(num_tokens, "num_tokens");
    if (!this.caching) throw new Refusal("ValueError", "prefix caching is disabled on this pool");
    const hbs = this.hashBlockSize;
    // From 0.32 (spec 9 delta partial-entries-at-boundaries) an entry may sit at a block boundary too.
    const atBoundaries = atLeast(this.release, "0.32.0");
    if ((block_size <= hbs && !atBoundaries) || block_size % hbs) throw new Refusal("ValueError", "block size incoherent");
    if (num_tokens === 0 || num_tokens % hbs || (num_tokens % block_size === 0 && !atBoundaries)) {
      throw new Refusal("ValueError", `${num_tokens} tokens is not a partial block boundary`);
    }
    const n = num_tokens / hbs;
    const fine = request.block_hashes;
    if (n > fine.length) throw new Refusal("ValueError", "too few hashes");
    if (this.ref[block_id] <= 0) throw new Refusal("ValueError", `block ${block_id} is cached but nobody holds it`);
    const key = Pool.key(fine[n - 1], group_id);
    if ((this.table.get(key) ?? []).includes(block_id)) return { bytes: key };
    if (this.tokensOf.has(block_id) && this.tokensOf.get(block_id) < num_tokens) this.evict(block_id);
    this.insert(block_id, key, num_tokens);
    if (this.eventsOn) {
      const start = (n - 1) * hbs;
      const [keys] = extraKeys(request, start, num_tokens, 0); // every image overlapping the hash block
      this.events.push({
        event: "stored", group: group_id, block_hashes: [eventHash(fine[n - 1])],
        parent_block_hash: n === 1 ? null : eventHash(fine[n - 2]),
        token_ids: request.all_token_ids.slice(start, num_tokens), block_size: hbs,
        lora_id: request.lora ? request.lora.lora[1] : null, lora_name: request.lora ? request.lora.lora[0] : null,
        extra_keys: [keys],
      });
    }
    return { bytes: key };
  }

  evict_blocks({ block_ids }) {
    const ids = (block_ids.set ?? block_ids).map((b) => this.requireBlock(b));
    for (const b of ids) this.evict(b);
    return null;
  }

  // spec 2: the share of usable blocks not free -- the free queue's length, cached blocks in it
  // included -- computed as written; 0 for a pool of the null block alone.
  get_usage() { return this.numBlocks > 1 ? 1 - this.free.length / (this.numBlocks - 1) : 0; }

  reset_prefix_cache() {
    if (this.free.length !== this.numBlocks - 1) return false;
    this.keyOf.clear();
    this.tokensOf.clear();
    this.partialOf.clear();
    this.table.clear();
    if (this.eventsOn) this.events.push({ event: "cleared" });
    return true;
  }

  state() {
    const cached = {};
    for (const b of [...this.keyOf.keys()].sort((x, y) => x - y)) cached[String(b)] = this.keyOf.get(b);
    const table = {};
    for (const k of [...this.table.keys()].sort()) table[k] = this.table.get(k);
    const partial = {};
    for (const b of [...this.partialOf.keys()].sort((x, y) => x - y)) partial[String(b)] = [...this.partialOf.get(b)].sort();
    return { ref: [0, ...this.ref.slice(1)], free: this.free, cached, table, partial };
  }
}

// The extra keys of tokens [start, end): the LoRA name, each image overlapping them ([identifier, where it
// starts relative to start]), the cache salt from the first token on -- and the image to resume from.
// mmIdx is where the image search starts; -1 counts from the end (the last image only).
export function extraKeys(request, start, end, mmIdx) {
  const keys = [];
  if (request.lora) keys.push(request.lora.lora[0]);
  const images = request.mm_features.map((f) => f.mm);
  let idx = mmIdx;
  if (images.length && images[images.length - 1][1] + images[images.length - 1][2] > start) {
    idx = mmIdx < 0 ? images.length + mmIdx : mmIdx;
    for (; idx < images.length; ) {
      const [id, offset, length] = images[idx];
      if (end <= offset) break;
      if (start >= offset + length) { idx += 1; continue; }
      keys.push([id, offset - start]);
      if (end >= offset + length) idx += 1;
      else break;
    }
  }
  if (start === 0 && request.cache_salt) keys.push(request.cache_salt);
  // spec 1.1 step 3: with a prompt given as embeddings, every block carries the SHA-256 of its
  // embedding rows' raw bytes (row-major; rows past the prompt contribute no bytes).
  if (request.prompt_embeds) {
    const digest = createHash("sha256");
    for (const row of request.prompt_embeds.slice(start, end)) digest.update(Buffer.from(row.bytes, "hex"));
    keys.push({ bytes: digest.digest("hex") });
  }
  return [keys.length ? keys : null, idx];
}

// The event one caching call emits: the new hashes, the parent's, the tokens
// of the whole range, and per cached block its extra keys.
export function storedEvent(request, hashes, fresh, chosen, blockSize, group) {
  const first = fresh[0];
  const end = fresh[fresh.length - 1] + 1;
  let mmIdx = 0;
  const extra = chosen.map((i) => {
    const [keys, next] = extraKeys(request, i * blockSize, (i + 1) * blockSize, mmIdx);
    mmIdx = next;
    return keys;
  });
  return {
    event: "stored",
    group,
    block_hashes: chosen.map((i) => eventHash(hashes[i])),
    parent_block_hash: first === 0 ? null : eventHash(hashes[first - 1]),
    token_ids: request.all_token_ids.slice(first * blockSize, end * blockSize),
    block_size: blockSize,
    lora_id: request.lora ? request.lora.lora[1] : null,
    lora_name: request.lora ? request.lora.lora[0] : null,
    extra_keys: extra.length ? extra : null,
  };
}

