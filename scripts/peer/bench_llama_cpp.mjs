// The peer side of scripts/bench-peer.sh: llama.cpp (the prebuilt CPU libraries that the npm
// package node-llama-cpp ships) on the cases of bench_engine --attention-suite, same shapes and
// same token counts, greedy decoding, flash attention on:
//   node bench_llama_cpp.mjs --model M.gguf --case "b1 ctx4096" [--threads 2] [--kv f16|f32|bf16]
// Prints one line: "peer | CASE | prefill X tok/s | decode Y tok/s" (X or Y "-" where the case
// has none). Prefill is the prompt's evaluation; decode is the generated tokens after the first,
// timed together (an end-of-generation token does not stop a sequence), as bench_engine times
// them; in a batch-32 case node-llama-cpp puts the sequences' next tokens into one llama_decode
// per step (31-32 tokens a step, counted at its initBatch calls).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
    return acc;
  }, []));
const threads = Number(args.threads ?? 2);
const kv = (args.kv ?? "f16").toUpperCase();
// name: [batch, prompt tokens, generated tokens]; bench_engine.cc's AttentionSuite cases.
const cases = {
  "b1 ctx256": [1, 256, 33],
  "b1 ctx4096": [1, 4096, 17],
  "b32 p128+128": [32, 128, 128],
  "b1 prompt 512": [1, 512, 1],
  "b1 ctx16384": [1, 16384, 17],
};
// The "gqa" cases: the same on the suite's 3-kv-head model (make_gguf.py --kv-heads 3), which
// --model must then name.
const c = cases[args.case?.replace(/^gqa /, "")];
if (!args.model || !c) {
  console.error(`usage: --model M.gguf --case "[gqa ]${Object.keys(cases).join('"|"')}" ` +
                "[--threads T] [--kv f16|f32|bf16]");
  process.exit(2);
}
const [batch, prompt, gen] = c;

// Prompts of ids in [3, 32000): a fixed LCG, so every run evaluates the same tokens.
let state = 12345;
const nextId = () => {
  state = (Math.imul(state, 1103515245) + 12345) >>> 0;
  return 3 + (state % 31997);
};

const llama = await getLlama({gpu: false, build: "never", maxThreads: threads,
                              logLevel: LlamaLogLevel.error});
// Read into memory at load (no mmap), as bitroll loads its weights, so no case pays page faults.
const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0, useMmap: false});
const options = {
  threads: {ideal: threads, min: threads},
  flashAttention: true,
  experimentalKvCacheKeyType: kv,
  experimentalKvCacheValueType: kv,
};
{  // Warm-up: 64 tokens through every layer and the classifier, in a context of its own.
  const warm = await model.createContext({contextSize: 256, sequences: 1, ...options});
  await warm.getSequence().evaluateWithoutGeneratingNewTokens(Array.from({length: 64}, nextId));
  await warm.dispose();
}
const context = await model.createContext({
  contextSize: prompt + gen + 16,  // per sequence
  sequences: batch,
  batchSize: Math.min(2048, batch * prompt),
  ...options,
});
const seqs = Array.from({length: batch}, () => context.getSequence());
const prompts = seqs.map(() => Array.from({length: prompt}, nextId));

const t0 = performance.now();
await Promise.all(seqs.map((s, i) => s.evaluateWithoutGeneratingNewTokens(prompts[i].slice(0, -1))));
// The last prompt token with the first sampled one: the step that ends the prefill.
const its = seqs.map((s, i) => s.evaluate([prompts[i][prompt - 1]], {temperature: 0, yieldEogToken: true}));
await Promise.all(its.map((it) => it.next()));
const t1 = performance.now();
await Promise.all(its.map(async (it) => {
  for (let k = 1; k < gen; ++k) {
    const r = await it.next();
    if (r.done) throw new Error("generation ended early");
  }
}));
const t2 = performance.now();
const prefill = batch * prompt / ((t1 - t0) / 1e3);
const decode = gen > 1 ? batch * (gen - 1) / ((t2 - t1) / 1e3) : null;
console.log(`peer | ${args.case} | prefill ${prefill.toFixed(1)} tok/s | decode ` +
            `${decode === null ? "-" : decode.toFixed(1) + " tok/s"} | kv ${kv.toLowerCase()} ` +
            `| threads ${threads}`);
await context.dispose();
await model.dispose();
await llama.dispose();
