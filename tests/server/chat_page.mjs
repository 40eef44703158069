// Drives the chat page of a running llm_server in headless Chromium (Debian's /usr/bin/chromium through npm
// playwright-core): opens it, sets temperature 0 and the max tokens, sends MESSAGE, waits for the streamed answer
// to finish; then sends a second message with LONG_MAX_TOKENS and presses Stop as soon as its first token shows.
// Saves a screenshot and prints JSON on stdout: {"text": the first answer as shown, "stats": the line under it,
// "done": how it ended, "model": the header's model line, "user": the message shown, "stopped": how the second
// answer ended, "stop_disabled": whether Stop is disabled at the end, "errors": page errors}.
// Usage: node chat_page.mjs NODE_MODULES_DIR URL MESSAGE MAX_TOKENS LONG_MAX_TOKENS SCREENSHOT.png
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [modules, url, message, maxTokens, longMaxTokens, shot] = process.argv.slice(2);
const { chromium } = await import(pathToFileURL(join(modules, "playwright-core", "index.mjs")).href);
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
});
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 600 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  let stopping = false;
  page.on("requestfailed", (r) => {
    if (!(stopping && r.failure().errorText === "net::ERR_ABORTED")) errors.push("request failed: " + r.url() + ": " + r.failure().errorText);
  });
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
  };
  // a long answer, stopped after its first token: the test adds ignore_eos to the page's request (a random model may
  // end its answer early), so the answer runs until Stop; the page's aborted request is no error
  await page.evaluate(() => {
    const plain = window.fetch;
    window.fetch = (url, init) => {
      if (String(url).endsWith("/v1/chat/completions")) init = { ...init, body: JSON.stringify({ ...JSON.parse(init.body), ignore_eos: true }) };
      return plain(url, init);
    };
  });
  stopping = true;
  // Stop is pressed by the page itself when the first token of the second answer shows (a MutationObserver): this
  // small model makes hundreds of tokens in the time a click from here would take
  await page.evaluate(() => {
    const obs = new MutationObserver(() => {
      const m = document.querySelectorAll(".msg.assistant .content");
      if (m.length === 2 && m[1].textContent.length > 0) {
        obs.disconnect();
        document.getElementById("stop").click();
      }
    });
    obs.observe(document.getElementById("log"), { childList: true, subtree: true, characterData: true });
  });
  await page.fill("#max-tokens", longMaxTokens);
  await page.fill("#input", "and now a long one");
  await page.click("#send");
  const second = page.locator(".msg.assistant").nth(1);
  await second.locator(".stats").filter({ hasText: "tokens/s" }).waitFor({ timeout: 20000 });
  out.stopped = await second.getAttribute("data-done");
  out.stop_disabled = await page.locator("#stop").isDisabled();
  out.errors = errors;
  await page.screenshot({ path: shot });
  process.stdout.write(JSON.stringify(out) + "\n");
} finally {
  await browser.close();
}
