// Drives the chat page of a running llm_server in headless Chromium (Debian's /usr/bin/chromium through npm
// playwright-core): opens it, sets temperature 0 and the max tokens, sends MESSAGE, waits for the streamed answer
// to finish, saves a screenshot and prints JSON on stdout: {"text": the answer as shown, "stats": the line under it,
// "done": how it ended, "model": the header's model line}.
// Usage: node chat_page.mjs NODE_MODULES_DIR URL MESSAGE MAX_TOKENS SCREENSHOT.png
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [modules, url, message, maxTokens, shot] = process.argv.slice(2);
const { chromium } = await import(pathToFileURL(join(modules, "playwright-core", "index.mjs")).href);
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 600 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("requestfailed", (r) => errors.push("request failed: " + r.url()));
  await page.goto(url, { timeout: 15000 });
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…", null, { timeout: 10000 });
  await page.fill("#temperature", "0");
  await page.fill("#max-tokens", maxTokens);
  await page.fill("#input", message);
  await page.click("#send");
  const answer = page.locator(".msg.assistant").last();
  await answer.locator(".stats").filter({ hasText: "tokens/s" }).waitFor({ timeout: 20000 });
  const out = {
    text: await answer.locator(".content").evaluate((e) => e.textContent),
    stats: await answer.locator(".stats").textContent(),
    done: await answer.getAttribute("data-done"),
    model: await page.locator("#model").textContent(),
    user: await page.locator(".msg.user .content").last().textContent(),
    errors,
  };
  await page.screenshot({ path: shot });
  process.stdout.write(JSON.stringify(out) + "\n");
} finally {
  await browser.close();
}
