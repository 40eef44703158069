// Runs a GGUF model with llama.cpp (npm node-llama-cpp, its prebuilt CPU binary) and prints JSON on stdout:
// {"prompt": [ids], "tokens": [greedy ids], "logits": [[vocab floats] per generated token]}.
// Usage: node llama_cpp_run.mjs NODE_MODULES_DIR MODEL.gguf PROMPT N
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [modules, modelPath, prompt, nText] = process.argv.slice(2);
const n = Number(nText);
const { getLlama } = await import(pathToFileURL(join(modules, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath });
const context = await model.createContext({ contextSize: 64, threads: 1 });
const seq = context.getSequence();
const ids = model.tokenize(prompt);
if (model.tokens.bos != null && model.tokens.shouldPrependBosToken) ids.unshift(model.tokens.bos);
const ask = { generateNext: { token: true, logits: true, options: { temperature: 0 } } };
const out = { prompt: ids.map(Number), tokens: [], logits: [] };
let input = ids.map((t, i) => (i === ids.length - 1 ? [t, ask] : t));
for (let step = 0; step < n; step++) {
  const res = await seq.controlledEvaluate(input);
  const next = res[input.length - 1].next;
  const row = [];
  for (const [tok, l] of next.logits) row[Number(tok)] = l;
  out.tokens.push(Number(next.token));
  out.logits.push(row);
  input = [[next.token, ask]];
}
process.stdout.write(JSON.stringify(out) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
