// bench/llm's peer: llama.cpp (npm node-llama-cpp, prebuilt CPU binary) on the same GGUF and the same tokens.
// Usage: node llm_llama_cpp.mjs NODE_MODULES_DIR MODEL.gguf CONTEXT THREADS PROMPT_IDS(comma-separated) N_DECODE REPS
// Prints JSON: {"prefill_ms": median over REPS, "decode_ms_per_token": median over REPS, "tokens": [greedy ids of the last rep]}.
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [modules, modelPath, ctxText, threadsText, idsText, nText, repsText] = process.argv.slice(2);
const { getLlama } = await import(pathToFileURL(join(modules, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath });
const ids = idsText.split(",").map(Number);
const n = Number(nText), reps = Number(repsText);
const context = await model.createContext({ contextSize: Number(ctxText), threads: Number(threadsText), batchSize: 512 });
const ask = { generateNext: { token: true, options: { temperature: 0 } } };
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const prefill = [], decode = [];
let tokens = [];
const seq = context.getSequence();
for (let r = 0; r <= reps; r++) {  // run 0 warms up
  await seq.clearHistory();
  let t = performance.now();
  let res = await seq.controlledEvaluate(ids.map((x, i) => (i === ids.length - 1 ? [x, ask] : x)));
  const p = performance.now() - t;
  let next = res[ids.length - 1].next.token;
  tokens = [next];
  t = performance.now();
  for (let i = 0; i < n; i++) {
    res = await seq.controlledEvaluate([[next, ask]]);
    next = res[0].next.token;
    tokens.push(next);
  }
  const d = (performance.now() - t) / n;
  if (r > 0) prefill.push(p), decode.push(d);
}
process.stdout.write(JSON.stringify({ prefill_ms: median(prefill), decode_ms_per_token: median(decode), tokens: tokens.map(Number) }) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
