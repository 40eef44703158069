// ONNX Runtime (npm onnxruntime-node, CPU) on one model, the peer of bench/onnx_models in the same run.
// usage: node onnx_peer.js MODEL INPUT.f32 D0,D1,... THREADS OUTPUT.f32 REPS
// Prints one JSON line: first_ms (session creation + first run), median_ms of REPS more runs, the output's dims;
// writes the first output's float32 values to OUTPUT.f32 for the comparison.
const fs = require('fs');
const ort = require('onnxruntime-node');

async function main() {
  const [model, inFile, dims, threads, outFile, reps] = process.argv.slice(2);
  const t0 = performance.now();
  const sess = await ort.InferenceSession.create(model, {
    intraOpNumThreads: Number(threads), interOpNumThreads: 1, executionMode: 'sequential', graphOptimizationLevel: 'all',
  });
  const buf = fs.readFileSync(inFile);
  const data = new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
  const feeds = {[sess.inputNames[0]]: new ort.Tensor('float32', data, dims.split(',').map(Number))};
  let out = await sess.run(feeds);
  const first = performance.now() - t0;
  const times = [];
  for (let i = 0; i < Number(reps); i++) {
    const t = performance.now();
    out = await sess.run(feeds);
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  const o = out[sess.outputNames[0]];
  fs.writeFileSync(outFile, Buffer.from(o.data.buffer, o.data.byteOffset, o.data.byteLength));
  console.log(JSON.stringify({first_ms: first, median_ms: times[times.length >> 1], dims: o.dims, version: ort.env.versions}));
}
main().catch((e) => { console.error(String(e)); process.exit(1); });
