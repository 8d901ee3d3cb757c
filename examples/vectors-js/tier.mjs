// An offloading tier -- vLLM's OffloadingManager -- in JavaScript, from spec/README.md chapter 11
// ("Tiers: an offloading manager": the operations table, "Exactly, step by step") and the offload
// scope of docs/VECTORS.md.  LRU or ARC, with a store threshold.
//
// Keys are the vectors' hex strings.  Every operation takes the vector's `args` object and answers in
// the vectors' JSON (keys as {"bytes": hex}); a refusal throws a Refusal("ValueError", ...).

import { Refusal } from "./pool.mjs";

const PENDING = -1;
const bytes = (hex) => ({ bytes: hex });
const hexOf = (key) => key.bytes;

// An insertion-ordered set with "move to the newest end" (a JS Set keeps insertion order).
class Ordered {
  constructor() { this.items = new Set(); }
  has(k) { return this.items.has(k); }
  get size() { return this.items.size; }
  push(k) { this.items.delete(k); this.items.add(k); } // to the newest end
  remove(k) { return this.items.delete(k); }
  oldest() { return this.items.values().next().value; }
  list() { return [...this.items]; }
  clear() { this.items.clear(); }
}

// LRU: the order holds exactly the evictable keys, oldest first.
class LRU {
  constructor() { this.order = new Ordered(); }
  prepared() {}
  becameEvictable(k) { this.order.push(k); }
  becameBusy(k) { this.order.remove(k); }
  dropped(k) { this.order.remove(k); }
  touch(keys) {
    for (const k of [...keys].reverse()) if (this.order.has(k)) this.order.push(k);
  }
  victims(n, asked) {
    const chosen = this.order.list().filter((k) => !asked.has(k)).slice(0, n);
    return chosen.length === n ? chosen : null;
  }
  evicted(keys) { for (const k of keys) this.order.remove(k); }
  clear() { this.order.clear(); }
  state() { return { lru: this.order.list() }; }
}

// ARC: T1 (used once), T2 (used again), ghosts B1 and B2, target p.
class ARC {
  constructor(capacity) {
    this.capacity = capacity;
    this.clear();
  }
  clear() {
    this.t1 = new Ordered();
    this.t2 = new Ordered();
    this.b1 = new Ordered();
    this.b2 = new Ordered();
    this.p = 0;
  }
  prepared(k) {
    this.t1.push(k);
    this.b1.remove(k);
    this.b2.remove(k);
  }
  becameEvictable() {} // loads and stores move nothing: ARC orders by use
  becameBusy() {}
  dropped(k) {
    this.t1.remove(k);
    this.t2.remove(k);
  }
  touch(keys, isReady) {
    for (const k of [...keys].reverse()) {
      if (this.t1.has(k)) {
        this.t1.remove(k);
        (isReady(k) ? this.t2 : this.t1).push(k);
      } else if (this.t2.has(k)) {
        this.t2.push(k);
      } else if (this.b1.has(k)) {
        this.p = Math.min(this.p + Math.max(1, this.b2.size / this.b1.size), this.capacity);
        this.b1.push(k);
      } else if (this.b2.has(k)) {
        this.p = Math.max(this.p - Math.max(1, this.b1.size / this.b2.size), 0);
        this.b2.push(k);
      }
    }
  }
  victims(n, asked, evictable) {
    const chosen = [];
    const can = (k) => evictable(k) && !asked.has(k) && !chosen.includes(k);
    const oldest = (list) => list.list().find(can);
    let t = this.t1.size;
    for (let i = 0; i < n; i++) {
      let pick;
      if (t >= Math.floor(this.p)) {
        pick = oldest(this.t1);
        if (pick !== undefined) t -= 1;
      }
      if (pick === undefined) pick = oldest(this.t2);
      if (pick === undefined) {
        pick = oldest(this.t1);
        if (pick === undefined) return null;
        t -= 1;
      }
      chosen.push(pick);
    }
    return chosen;
  }
  evicted(keys) {
    for (const k of keys) {
      if (this.t1.remove(k)) this.b1.push(k);
      else if (this.t2.remove(k)) this.b2.push(k);
    }
    for (const ghosts of [this.b1, this.b2]) while (ghosts.size > this.capacity) ghosts.remove(ghosts.oldest());
  }
  state() {
    return { t1: this.t1.list(), t2: this.t2.list(), b1: this.b1.list(), b2: this.b2.list(), target: this.p };
  }
}

export class Tier {
  constructor(config) {
    const { num_blocks, cache_policy = "lru", enable_events = false, store_threshold = 1, max_tracker_size = 64000 } = config;
    if (!Number.isInteger(num_blocks) || num_blocks < 1) throw new Refusal("ValueError", `num_blocks ${num_blocks}`);
    if (cache_policy !== "lru" && cache_policy !== "arc") throw new Refusal("ValueError", `cache policy ${cache_policy}`);
    this.numBlocks = num_blocks;
    this.policy = cache_policy === "lru" ? new LRU() : new ARC(num_blocks);
    this.entries = new Map(); // hex key -> [block, count or PENDING]
    this.fresh = 0;
    this.freed = [];
    this.events = enable_events ? [] : null;
    this.threshold = store_threshold >= 2 ? store_threshold : null;
    this.trackerSize = max_tracker_size;
    this.counts = new Map(); // insertion order = order of the last ask
  }

  // --- helpers
  stored(k) { return this.entries.has(k) && this.entries.get(k)[1] !== PENDING; }
  evictable(k) { return this.entries.has(k) && this.entries.get(k)[1] === 0; }
  numEvictable() { return [...this.entries.keys()].filter((k) => this.evictable(k)).length; }
  numFree() { return this.numBlocks - this.fresh + this.freed.length; }
  takeBlock() { return this.fresh < this.numBlocks ? this.fresh++ : this.freed.pop(); }
  emit(removed, keys) { if (this.events !== null && keys.length) this.events.push([removed, keys.map(bytes)]); }

  // --- operations
  lookup({ key }) {
    const k = hexOf(key);
    if (this.threshold !== null) {
      const count = this.counts.get(k);
      if (count !== undefined) this.counts.delete(k);
      else if (this.counts.size >= this.trackerSize) this.counts.delete(this.counts.keys().next().value);
      this.counts.set(k, (count ?? 0) + 1);
    }
    if (!this.entries.has(k)) return "MISS";
    return this.stored(k) ? "HIT" : "HIT_PENDING";
  }

  prepare_load({ keys }) {
    const ks = keys.map(hexOf);
    for (const k of ks) if (!this.stored(k)) throw new Refusal("ValueError", `prepare_load of ${k}: not stored (tier-content-soundness)`);
    for (const k of ks) {
      const entry = this.entries.get(k);
      if (entry[1] === 0) this.policy.becameBusy(k);
      entry[1] += 1;
    }
    return ks.map((k) => this.entries.get(k)[0]);
  }

  touch({ keys }) {
    this.policy.touch(keys.map(hexOf), (k) => this.stored(k));
    return null;
  }

  complete_load({ keys }) {
    const ks = keys.map(hexOf);
    const need = new Map();
    for (const k of ks) need.set(k, (need.get(k) ?? 0) + 1);
    for (const [k, n] of need) {
      if (!this.stored(k) || this.entries.get(k)[1] < n) throw new Refusal("ValueError", `complete_load of ${k}: no load in flight (tier-ref-conservation)`);
    }
    for (const k of ks) {
      const entry = this.entries.get(k);
      entry[1] -= 1;
      if (entry[1] === 0) this.policy.becameEvictable(k);
    }
    return null;
  }

  prepare_store({ keys }) {
    const asked = keys.map(hexOf);
    if (new Set(asked).size !== asked.length) throw new Refusal("ValueError", "prepare_store of repeated keys (tier-content-soundness)");
    const passing = this.threshold === null ? asked : asked.filter((k) => (this.counts.get(k) ?? 0) >= this.threshold);
    const toStore = passing.filter((k) => !this.entries.has(k));
    if (toStore.length === 0) return [[], [], []];
    const lacking = toStore.length - this.numFree();
    let victims = [];
    if (lacking > 0) {
      if (lacking > this.numEvictable()) return null;
      victims = this.policy.victims(lacking, new Set(asked), (k) => this.evictable(k));
      if (victims === null) return null;
      this.policy.evicted(victims);
      for (const k of victims) {
        this.freed.push(this.entries.get(k)[0]);
        this.entries.delete(k);
      }
      this.emit(true, victims);
    }
    const blocks = [];
    for (const k of toStore) {
      blocks.push(this.takeBlock());
      this.entries.set(k, [blocks.at(-1), PENDING]);
      this.policy.prepared(k);
    }
    return [toStore.map(bytes), blocks, victims.map(bytes)];
  }

  complete_store({ keys, success = true }) {
    const pending = [...new Set(keys.map(hexOf))].filter((k) => this.entries.has(k) && !this.stored(k));
    for (const k of pending) {
      if (success) {
        this.entries.get(k)[1] = 0;
        this.policy.becameEvictable(k);
      } else {
        this.policy.dropped(k);
        this.freed.push(this.entries.get(k)[0]);
        this.entries.delete(k);
      }
    }
    if (success) this.emit(false, pending);
    return null;
  }

  reset_cache() {
    this.entries.clear();
    this.policy.clear();
    this.fresh = 0;
    this.freed = [];
    return null;
  }

  take_events() {
    if (this.events === null) return [];
    return this.events.splice(0);
  }

  // The state as the vectors record it (docs/VECTORS.md, offload scope).
  state() {
    const keys = [...this.entries.keys()].sort();
    return {
      entries: Object.fromEntries(keys.map((k) => [k, [...this.entries.get(k)]])),
      evictable: keys.filter((k) => this.evictable(k)),
      num_evictable: this.numEvictable(),
      policy: this.policy.state(),
    };
  }
}
