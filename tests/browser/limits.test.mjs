// Flow control in the web console (SPEC §14), in a real Chromium against a real server: the
// limits `example-sagas serve` declares for `payout`, what holds and waits for them, an
// operator's change of a limit and of the bank's rate (a refused one shown as the server said
// it), a saga waiting for a limit and its priority on the list and its page, and a read-only
// token offered no change.
//
// Run with `npm test` here, after `cargo build -p example-sagas` (scripts/test.sh does both).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer, signedIn, waitFor, launchBrowser, TOKENS } from './harness.mjs';

const axePath = createRequire(import.meta.url).resolve('axe-core/axe.min.js');

let browser;
before(async () => {
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
});

/** A payout of `merchant` whose every step takes a minute: it holds its merchant's slot. */
async function slowPayout(server, id, merchant, headers = {}) {
  const body = { payout_id: id, merchant, amount: 500, simulate: { delay_ms: 60000 } };
  return (await server.api('/v1/sagas/payout', { method: 'POST', body, headers })).id;
}

/** The value cell of limit `name` on the limits page. */
const value = (page, name) => page.locator(`[data-value="${name}"]`);

test('the limits page lists the declared limits with what holds and waits for them, and an operator changes one', async () => {
  const server = await startServer({ tokens: true });
  try {
    const first = await slowPayout(server, 'pay-1', 'acme');
    await waitFor(server, first, (s) => s.status === 'RUNNING');
    const second = await slowPayout(server, 'pay-2', 'acme', { 'Saga-Priority': '7' });
    await waitFor(server, second, (s) => s.waiting_for === 'limit:payout_per_merchant');

    const { page, context, errors } = await signedIn(browser, server, '#/', TOKENS.admin);
    // The list says what the second payout waits for, and leads to the limits.
    const waiting = page.locator(`tbody tr[data-key="${second}"] [data-wait]`);
    await waiting.waitFor();
    assert.equal(await waiting.getAttribute('data-wait'), 'limit:payout_per_merchant');
    assert.equal(await waiting.innerText(), 'limit:payout_per_merchant');
    await page.getByRole('navigation', { name: 'Pages' }).getByRole('link', { name: 'Limits' }).click();
    await page.waitForFunction(() => location.hash === '#/limits');
    assert.equal(await page.getByRole('link', { name: 'Limits', exact: true }).getAttribute('aria-current'), 'page');

    // Every limit `payout` declares, as declared, with the merchant's slot held and one waiting.
    await value(page, 'payout_per_merchant').waitFor();
    const names = await page.locator('tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.limit));
    assert.deepEqual(names, ['bank', 'payout_per_merchant', 'payout_running']);
    assert.equal(await value(page, 'bank').innerText(), '20/s, burst 5');
    assert.equal(await value(page, 'payout_per_merchant').innerText(), '1');
    assert.equal(await value(page, 'payout_running').innerText(), '50');
    const row = page.locator('tbody tr[data-limit="payout_per_merchant"]');
    assert.match(await row.innerText(), /of payout, key merchant/);
    assert.deepEqual(await row.locator('td.num').allInnerTexts(), ['1', '1'], 'one running, one waiting');
    assert.match(await page.locator('tbody tr[data-limit="payout_running"]').innerText(), /as declared/);

    // An operator raises the per-merchant limit: the waiting payout starts, and the page says
    // who changed what.
    await page.getByRole('button', { name: 'Change payout_per_merchant…' }).click();
    const dialog = page.getByRole('dialog');
    await dialog.getByLabel('Limit (per key)').fill('2');
    await dialog.getByLabel(/Reason/).fill('two at once for acme');
    await dialog.getByRole('button', { name: 'Change', exact: true }).click();
    await page.locator('#toast').getByText('payout_per_merchant is now 2.').waitFor();
    await page.waitForFunction(() => document.querySelector('[data-value="payout_per_merchant"]').textContent === '2');
    const changed = page.locator('tbody tr[data-limit="payout_per_merchant"]');
    assert.match(await changed.innerText(), /declared: 1/);
    assert.match(await changed.innerText(), /ops/);
    await waitFor(server, second, (s) => s.status === 'RUNNING' && s.waiting_for === null);
    const { limits } = await server.api('/v1/limits');
    const perMerchant = limits.find((l) => l.name === 'payout_per_merchant');
    assert.equal(perMerchant.limit, 2);
    assert.equal(perMerchant.updated_by, 'ops');
    assert.equal(perMerchant.declared.limit, 1);

    // A rate the server refuses is shown as it said it, and the dialog stays open to fix it.
    await page.getByRole('button', { name: 'Change bank…' }).click();
    await dialog.getByLabel(/Rate/).fill('fast');
    await dialog.getByRole('button', { name: 'Change', exact: true }).click();
    await dialog.getByRole('alert').getByText(/Refused: 422 invalid_rate: invalid rate "fast"/).waitFor();
    await dialog.getByLabel(/Rate/).fill('40/s');
    await dialog.getByLabel(/Burst/).fill('8');
    await dialog.getByRole('button', { name: 'Change', exact: true }).click();
    await page.locator('#toast').getByText('bank is now 40/s, burst 8.').waitFor();
    await page.waitForFunction(() => document.querySelector('[data-value="bank"]').textContent === '40/s, burst 8');
    assert.match(await page.locator('tbody tr[data-limit="bank"]').innerText(), /declared: 20\/s, burst 5/);

    // The saga page shows the priority its start asked for.
    await page.goto(`${server.base}/ui/#/sagas/${second}`);
    await page.locator('[data-key="priority"]').getByText('7 (0 last, 9 first)').waitFor();
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('a saga waiting for a limit says so on its page, linking to the limits, which pass the WCAG checks of axe', async () => {
  const server = await startServer({ tokens: true });
  try {
    const first = await slowPayout(server, 'pay-3', 'globex');
    await waitFor(server, first, (s) => s.status === 'RUNNING');
    const second = await slowPayout(server, 'pay-4', 'globex');
    await waitFor(server, second, (s) => s.waiting_for === 'limit:payout_per_merchant');
    // axe is injected as a script, which the console's own policy forbids: this context only.
    const { page, context, errors } = await signedIn(browser, server, `#/sagas/${second}`, TOKENS.admin, { bypassCSP: true });
    const badge = page.locator('h1 [data-key="waiting"]');
    await badge.waitFor();
    assert.equal(await badge.innerText(), 'waiting for limit:payout_per_merchant');
    assert.equal(await page.locator('[data-key="priority"] dd').innerText(), '5 (the default)');
    await badge.getByRole('link', { name: 'payout_per_merchant' }).click();
    await value(page, 'payout_per_merchant').waitFor();
    await page.addScriptTag({ path: axePath });
    const result = await page.evaluate(() => window.axe.run(document, { runOnly: ['wcag2a', 'wcag2aa', 'wcag21aa'] }));
    const violations = result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
    assert.deepEqual(violations, [], 'the limits page');
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('a read-only token sees the limits and no change action', async () => {
  const server = await startServer({ tokens: true });
  try {
    const { page, context, errors } = await signedIn(browser, server, '#/limits', TOKENS.reader);
    await value(page, 'bank').waitFor();
    assert.equal(await page.locator('tbody tr').count(), 3);
    assert.equal(await page.getByRole('button', { name: /Change/ }).count(), 0, 'no change offered');
    assert.equal(await page.locator('thead th').count(), 6, 'no action column');
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});
