// NATS triggers in the web console (SPEC §17), in a real Chromium against a real server started
// with `--nats-url` to a real nats-server and one `--nats-trigger`: the Triggers page lists the
// trigger with its consumer's lag, and a message whose body is not JSON among the refused ones
// with its error, checked against `GET /v1/triggers` and by axe.
//
// Run with `npm test` here, after `cargo build --workspace --bins` (scripts/test.sh does both).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer, startNats, launchBrowser } from './harness.mjs';

const axePath = createRequire(import.meta.url).resolve('axe-core/axe.min.js');
const TRIGGER = 'orders.placed=place_order';

let browser;
before(async () => {
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
});

test('the triggers page lists the trigger with its lag and a refused message with its error', async () => {
  const nats = await startNats();
  let server;
  try {
    server = await startServer({ args: ['--nats-url', nats.url, '--nats-trigger', TRIGGER] });
    // The server made the stream once it listened: one good message and one poison body.
    await nats.publish('orders.placed', JSON.stringify({ order_id: 'o-1', user: 'ada', amount: 5 }));
    await nats.publish('orders.placed', 'this is not json');
    const deadline = Date.now() + 30_000;
    let listed;
    for (;;) {
      listed = await server.api('/v1/triggers');
      const t = listed.triggers[0];
      if (t && t.started === 1 && t.refused === 1 && Number.isInteger(t.lag) && listed.refusals.length === 1) break;
      if (Date.now() > deadline) throw new Error(`the trigger never got there: ${JSON.stringify(listed)}`);
      await new Promise((ok) => setTimeout(ok, 100));
    }
    const refusal = listed.refusals[0];

    const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, bypassCSP: true });
    const page = await context.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(`${server.base}/ui/#/`);
    await page.getByRole('navigation', { name: 'Pages' }).getByRole('link', { name: 'Triggers' }).click();
    await page.waitForFunction(() => location.hash === '#/triggers');

    const row = page.locator(`table.triggers tbody tr[data-trigger="${TRIGGER}"]`);
    await row.waitFor();
    assert.equal(await page.locator('table.triggers tbody tr').count(), 1);
    const cells = await row.locator('th, td').allTextContents();
    assert.equal(cells[0], 'orders.placed');
    assert.equal(cells[1], 'place_order');
    assert.equal(cells[2], 'SAGA_TRIGGERS');
    // The lag is a number read from the consumer (not the dash of an unknown lag).
    await page.waitForFunction((t) => /^\d+$/.test(document.querySelector(`[data-lag="${t}"]`)?.textContent ?? ''), TRIGGER);
    assert.match(await page.locator(`[data-lag="${TRIGGER}"]`).innerText(), /^\d+$/);
    assert.equal(cells[5], '1', 'started');
    assert.equal(cells[6], '1', 'refused');

    const refused = page.locator('table.refusals tbody tr');
    await refused.first().waitFor();
    assert.equal(await refused.count(), 1);
    const shown = await refused.first().locator('td').allTextContents();
    assert.equal(shown[1], TRIGGER);
    assert.equal(shown[2], `SAGA_TRIGGERS:${refusal.stream_seq}`);
    assert.equal(shown[3], refusal.error, 'the error the API recorded');
    assert.ok(refusal.error.length > 0);
    assert.equal(shown[4], 'this is not json');
    assert.match(await page.locator('section[aria-labelledby="t-title"]').innerText(), new RegExp(`${TRIGGER.replace('.', '\\.')}: 1`));

    await page.addScriptTag({ path: axePath });
    const result = await page.evaluate(() => window.axe.run(document, { runOnly: ['wcag2a', 'wcag2aa', 'wcag21aa'] }));
    const violations = result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
    assert.deepEqual(violations, [], 'the triggers page');
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server?.stop();
    await nats.stop();
  }
});
