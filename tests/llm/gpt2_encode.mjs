// Encodes texts with the npm package gpt-3-encoder (a JS port of OpenAI's GPT-2 encoder) and prints JSON on stdout:
// one list of token ids per text. Usage: node gpt2_encode.mjs NODE_MODULES_DIR TEXTS.json
import { createRequire } from "node:module";
import { join } from "node:path";
import { readFileSync } from "node:fs";

const [modules, textsPath] = process.argv.slice(2);
const { encode } = createRequire(import.meta.url)(join(modules, "gpt-3-encoder"));
const out = JSON.parse(readFileSync(textsPath, "utf8")).map((text) => encode(text));
process.stdout.write(JSON.stringify(out) + "\n");
