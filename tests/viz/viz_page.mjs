// Drives the VIZ page of a running program in headless Chromium (Debian's /usr/bin/chromium through npm
// playwright-core): clicks the last kernel in the list (the README matmul's reduce kernel), picks its first rewrite
// with two or more rules, steps forward twice, and records the highlighted (changed) nodes before and after each step;
// then opens the Profile tab. Saves a screenshot of the second step and prints JSON on stdout: {"kernel", "stage",
// "steps", "changed": [[node labels] x 3], "step_text", "rule", "source" (its start), "timeline_kernels", "errors"}.
// Usage: node viz_page.mjs NODE_MODULES_DIR URL SCREENSHOT.png
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [modules, url, shot] = process.argv.slice(2);
const { chromium } = await import(pathToFileURL(join(modules, "playwright-core", "index.mjs")).href);
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 800 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("requestfailed", (r) => errors.push("request failed: " + r.url() + ": " + r.failure().errorText));
  await page.goto(url, { timeout: 15000 });
  const kernel = page.locator('.ctx[data-kind="kernel"]').last();
  await kernel.waitFor({ timeout: 10000 });
  const name = await kernel.locator(".name").textContent();
  await kernel.click();
  const rw = kernel.locator("xpath=following-sibling::div[1]").locator(".rw").filter({ has: page.locator(".n", { hasText: "rules" }) });
  const n = await rw.count();
  let pick = -1;
  for (let i = 0; i < n && pick < 0; i++) if (+(await rw.nth(i).getAttribute("data-steps")) >= 2) pick = i;
  if (pick < 0) throw new Error("no rewrite with two rules in kernel " + name);
  const target = rw.nth(pick);
  const stage = await target.locator(".s").textContent();
  const steps = +(await target.getAttribute("data-steps"));
  const changed = async () => {
    await page.waitForFunction(() => !document.getElementById("graph").dataset.loading && document.querySelector("#graph svg"));
    return page.$$eval("#graph g.node.changed", (gs) => gs.map((g) => g.querySelector("title").textContent.replace("\n", " ")));
  };
  await target.click();
  await page.waitForFunction(() => document.getElementById("step").textContent.startsWith("step 0 /"));
  const c0 = await changed();
  await page.click("#next");
  await page.waitForFunction(() => document.getElementById("step").textContent.startsWith("step 1 /"));
  const c1 = await changed();
  const ids1 = await page.$$eval("#graph g.node", (gs) => gs.map((g, i) => g.classList.contains("changed") ? i : -1).filter((i) => i >= 0));
  await page.click("#next");
  await page.waitForFunction(() => document.getElementById("step").textContent.startsWith("step 2 /"));
  const c2 = await changed();
  const ids2 = await page.$$eval("#graph g.node", (gs) => gs.map((g, i) => g.classList.contains("changed") ? i : -1).filter((i) => i >= 0));
  const out = {
    kernel: name, stage, steps,
    // node positions (topological order) with their labels: the same label at another place is another node
    changed: [c0, c1.map((l, i) => ids1[i] + ": " + l), c2.map((l, i) => ids2[i] + ": " + l)],
    step_text: await page.locator("#step").textContent(),
    rule: await page.locator("#rule").textContent(),
    source: (await page.locator("#source").textContent()).slice(0, 200),  // its first lines name the kernel
  };
  await page.screenshot({ path: shot });
  await page.click("#tab-profile");
  await page.locator("#timeline-svg").waitFor({ timeout: 10000 });
  out.timeline_kernels = await page.locator("#timeline-svg rect.ev-kernel").count();
  await page.screenshot({ path: shot.replace(/\.png$/, "_profile.png") });
  out.errors = errors;
  process.stdout.write(JSON.stringify(out) + "\n");
} finally {
  await browser.close();
}
