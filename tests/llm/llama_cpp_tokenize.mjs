// Tokenizes texts with llama.cpp (npm node-llama-cpp) and prints JSON on stdout: one list of token ids per text,
// BOS first where llama.cpp adds one. Usage: node llama_cpp_tokenize.mjs NODE_MODULES_DIR MODEL.gguf TEXTS.json
import { pathToFileURL } from "node:url";
import { join } from "node:path";
import { readFileSync } from "node:fs";

const [modules, modelPath, textsPath] = process.argv.slice(2);
const { getLlama } = await import(pathToFileURL(join(modules, "node-llama-cpp", "dist", "index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath });
const out = JSON.parse(readFileSync(textsPath, "utf8")).map((text) => {
  const ids = model.tokenize(text).map(Number);
  if (model.tokens.bos != null && model.tokens.shouldPrependBosToken) ids.unshift(Number(model.tokens.bos));
  return ids;
});
process.stdout.write(JSON.stringify(out) + "\n");
await model.dispose();
await llama.dispose();
