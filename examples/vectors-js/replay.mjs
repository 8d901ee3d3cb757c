// kvspec's conformance vectors, replayed in JavaScript.
//
// This code knows nothing of kvspec's Python code: it reads the vector format (docs/VECTORS.md), the
// pool (pool.mjs) implements chapter 1 of spec/README.md, the manager (manager.mjs) chapters 2-9 and
// the offloading tier (tier.mjs) chapter 11, from the prose.  It replays every *.json vector under DIR,
// pool, manager and offload scopes alike.
//
//   node examples/vectors-js/replay.mjs DIR
//
// It prints the first difference of each failing vector (step, field, expected vs got) and, at the
// end, passed / total per directory (scope, kind of vector, layout).  Exit 0 when every vector agrees,
// 1 when one differs or cannot be read.

import { existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { Pool, Refusal } from "./pool.mjs";
import { Manager } from "./manager.mjs";
import { Tier } from "./tier.mjs";

// The manager's optional queries (VECTORS.md): they change nothing, so a target may lack them.
const OPTIONAL_QUERIES = new Set(["get_usage", "get_block_ids_for_computed_tokens", "find_longest_cache_hit_per_group"]);

const canonical = (v) =>
  JSON.stringify(v, (_, x) => (x && typeof x === "object" && !Array.isArray(x) && !(x instanceof Map) ? Object.fromEntries(Object.entries(x).sort()) : x));
const same = (a, b) => canonical(a) === canonical(b);
const short = (v, n = 400) => {
  const text = canonical(v) ?? "undefined";
  return text.length > n ? text.slice(0, n) + "..." : text;
};

// Which keys an operation drops is the contract, not the order it drops them in (evict_blocks takes a
// set, a block's partial entries are a set): each run of consecutive "removed" events compares as a multiset.
function comparable(events) {
  const out = [];
  let run = [];
  for (const event of [...events, null]) {
    if (event !== null && event.event === "removed") {
      run.push(canonical(event));
      continue;
    }
    out.push(...run.sort());
    run = [];
    if (event !== null) out.push(canonical(event));
  }
  return out;
}

// The first place two values differ, as a path and the two values there.
function firstDifference(got, expected, path = "") {
  if (same(got, expected)) return null;
  if (Array.isArray(got) && Array.isArray(expected) && got.length === expected.length) {
    for (let i = 0; i < got.length; i++) {
      const d = firstDifference(got[i], expected[i], `${path}[${i}]`);
      if (d) return d;
    }
  }
  if (got && expected && typeof got === "object" && typeof expected === "object" && !Array.isArray(got) && !Array.isArray(expected)) {
    for (const k of [...new Set([...Object.keys(got), ...Object.keys(expected)])].sort()) {
      const d = firstDifference(got[k], expected[k], `${path}.${k}`);
      if (d) return d;
    }
  }
  return { path, got, expected };
}

// A request as the target sees it at a step: what never changes (vector.requests) and its progress.
function requestAt(vector, id, progress) {
  const identity = vector.requests[id];
  const all = [...identity.prompt_token_ids, ...progress.output_token_ids];
  return {
    ...identity, ...progress, id,
    all_token_ids: all,
    num_tokens: all.length,
    num_prompt_tokens: identity.prompt_token_ids.length,
  };
}

function build(vector) {
  if (vector.scope === "offload") return new Tier(vector.config);
  return vector.scope === "pool" ? new Pool(vector.config) : new Manager(vector.config);
}

// Replays one vector; answers null when it agrees, else its first difference.
function replay(vector) {
  if (vector.refused !== undefined) { // a configuration the target must refuse to be built with
    try {
      build(vector);
    } catch (error) {
      if (!(error instanceof Refusal)) return `construction: crashed (${error.stack})`;
      if (vector.refused_with !== undefined && error.kind !== vector.refused_with) {
        return `construction: refused with ${error.kind} (${error.message}), expected a ${vector.refused_with} (${vector.refused})`;
      }
      return null;
    }
    return `construction: built a ${vector.scope}; the configuration breaks ${vector.refused} and must be refused`;
  }
  const target = build(vector);
  // A tier's events are an operation's result (take_events), not a side channel: none to compare here.
  const takeEvents = () => (vector.scope === "pool" ? target.events.splice(0) : vector.scope === "offload" ? [] : target.takeEvents());
  const expected = { ...vector.initial_state };
  const compareState = (where) => {
    const got = target.state();
    for (const [part, value] of Object.entries(expected)) {
      const d = firstDifference(got[part], value);
      if (d) return `${where}: state ${part}${d.path}: expected ${short(d.expected)}, got ${short(d.got)}`;
    }
    return null;
  };
  let problem = compareState("initial state");
  if (problem) return problem;
  for (const [n, step] of vector.steps.entries()) {
    const where = `step ${n} ${step.op}`;
    if (typeof target[step.op] !== "function") {
      if (OPTIONAL_QUERIES.has(step.op)) continue; // VECTORS.md: a target without an optional query skips it
      return `${where}: the target has no such operation`;
    }
    const args = { ...step.args };
    if (args.request) {
      const id = args.request.request;
      args.request = requestAt(vector, id, step.progress[id]);
    }
    let result = null;
    let refusal = null;
    try {
      result = target[step.op](args);
    } catch (error) {
      if (!(error instanceof Refusal)) return `${where}: crashed (${error.stack.split("\n").slice(0, 3).join(" | ")})`;
      refusal = error;
    }
    if ("refused" in step) {
      if (!refusal) return `${where}: result: expected a ${step.refused} refusal, got ${short(result)}`;
      if (refusal.kind !== step.refused) return `${where}: refusal: expected ${step.refused}, got ${refusal.kind} (${refusal.message})`;
    } else if (refusal) {
      return `${where}: result: expected ${short(step.result ?? step.at_most)}, got a ${refusal.kind} refusal (${refusal.message})`;
    } else if ("at_most" in step) { // VECTORS.md: a bounded observation, one count per entry, each from 0 to it
      const ok = Array.isArray(result) && result.length === step.at_most.length
        && result.every((n, g) => Number.isInteger(n) && n >= 0 && n <= step.at_most[g]);
      if (!ok) return `${where}: result: expected counts of at most ${short(step.at_most)}, got ${short(result)}`;
    } else if (!same(result, step.result)) {
      const d = firstDifference(result, step.result);
      return `${where}: result${d.path}: expected ${short(d.expected)}, got ${short(d.got)}`;
    }
    Object.assign(expected, step.state ?? {});
    problem = compareState(where);
    if (problem) return problem;
    const events = takeEvents();
    const got = comparable(events);
    const want = comparable(step.events ?? []);
    if (!same(got, want)) {
      const d = firstDifference(got.map((e) => JSON.parse(e)), want.map((e) => JSON.parse(e)));
      return `${where}: events${d.path}: expected ${short(d.expected)}, got ${short(d.got)}`;
    }
  }
  return null;
}

function files(root) {
  if (statSync(root).isFile()) return [root];
  return readdirSync(root, { recursive: true })
    .filter((f) => f.endsWith(".json") && !["index.json", "coverage.json"].includes(basename(f)))
    .map((f) => join(root, f))
    .sort();
}

const root = process.argv[2];
if (!root) {
  console.error("usage: node replay.mjs VECTORS_DIR");
  process.exit(2);
}
if (!existsSync(root)) {
  console.error(`replay.mjs: ${root}: no such file or directory`);
  process.exit(2);
}
const tally = new Map(); // directory (scope/kind/layout) -> [passed, total]
let failed = 0;
let unreadable = 0;
for (const path of files(root)) {
  let vector;
  try {
    vector = JSON.parse(readFileSync(path, "utf8"));
    if (vector.kvspec_vectors !== 1) throw new Error(`format ${vector.kvspec_vectors}, this replayer reads 1`);
  } catch (error) {
    unreadable += 1;
    console.log(`UNREADABLE ${path}: ${error.message}`);
    continue;
  }
  const dir = vector.name.split("/").slice(0, -1).join("/");
  const counts = tally.get(dir) ?? [0, 0];
  counts[1] += 1;
  let problem;
  try {
    problem = replay(vector);
  } catch (error) {
    const what = error instanceof Refusal ? `refused with ${error.kind}` : "crashed";
    problem = `construction: ${what} (${error.message}), expected a ${vector.scope} to be built`;
  }
  if (problem) {
    failed += 1;
    console.log(`FAIL ${vector.name}\n     ${problem}`);
  } else counts[0] += 1;
  tally.set(dir, counts);
}
console.log("\npassed / total");
const scopes = new Map();
for (const dir of [...tally.keys()].sort()) {
  const [passed, total] = tally.get(dir);
  console.log(`  ${dir.padEnd(48)} ${String(passed).padStart(3)} / ${total}`);
  const scope = dir.split("/")[0];
  const s = scopes.get(scope) ?? [0, 0];
  s[0] += passed;
  s[1] += total;
  scopes.set(scope, s);
}
for (const [scope, [passed, total]] of scopes) console.log(`  ${(scope + " (all)").padEnd(48)} ${String(passed).padStart(3)} / ${total}`);
const total = [...tally.values()].reduce((n, [, t]) => n + t, 0);
const byScope = (scope) => scopes.get(scope)?.[1] ?? 0;
console.log(`${total} vectors replayed in JavaScript (${byScope("pool")} pool, ${byScope("manager")} manager, ${byScope("offload")} offload): ${failed} differ, ${unreadable} unreadable`);
process.exit(failed || unreadable || total === 0 ? 1 : 0);
