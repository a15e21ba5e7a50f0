// Schedules in the web console (SPEC §17), in a real Chromium against a real server: the list
// with each schedule's next runs and latest run, a schedule's page with its runs linked to
// their sagas, an operator's pause, trigger and delete through the dialogs, the WCAG checks
// of axe, and a read-only token offered no action.
//
// Run with `npm test` here, after `cargo build -p example-sagas` (scripts/test.sh does both).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer, signedIn, launchBrowser, TOKENS } from './harness.mjs';

const axePath = createRequire(import.meta.url).resolve('axe-core/axe.min.js');

let browser;
before(async () => {
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
});

/** Makes the two schedules of these tests: a nightly one in Paris, and one every second. */
async function makeSchedules(server) {
  await server.api('/v1/schedules', {
    method: 'POST',
    body: {
      id: 'nightly', saga: 'place_order', cron: '0 2 * * *', timezone: 'Europe/Paris',
      input: { order_id: 'night', user: 'ada', amount: 100 },
    },
  });
  await server.api('/v1/schedules', {
    method: 'POST',
    body: {
      id: 'often', saga: 'place_order', every: '1s', overlap: 'allow_all',
      input: { order_id: 'often', user: 'ada', amount: 1 },
    },
  });
}

test('the schedules page lists next and latest runs, a schedule\'s page links its runs to their sagas, and an operator pauses, fires and deletes', async () => {
  const server = await startServer({ tokens: true });
  try {
    await makeSchedules(server);
    const { page, context, errors } = await signedIn(browser, server, '#/', TOKENS.admin, { bypassCSP: true });
    await page.getByRole('navigation', { name: 'Pages' }).getByRole('link', { name: 'Schedules' }).click();
    await page.waitForFunction(() => location.hash === '#/schedules');
    const row = (id) => page.locator(`tbody tr[data-schedule="${id}"]`);
    await row('nightly').waitFor();
    const ids = await page.locator('tbody tr').evaluateAll((rows) => rows.map((r) => r.dataset.schedule));
    assert.deepEqual(ids, ['nightly', 'often']);
    assert.match(await row('nightly').innerText(), /0 2 \* \* \* \(Europe\/Paris\)/);
    assert.equal(await page.locator('[data-next="nightly"] time').count(), 3, 'three next runs');
    // The one every second has run: its latest run links to its saga.
    await row('often').locator('[data-outcome="started"]').waitFor({ timeout: 15_000 });
    await row('often').locator('a[href^="#/sagas/"]').waitFor();

    await page.addScriptTag({ path: axePath });
    const result = await page.evaluate(() => window.axe.run(document, { runOnly: ['wcag2a', 'wcag2aa', 'wcag21aa'] }));
    const violations = result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
    assert.deepEqual(violations, [], 'the schedules page');

    // Paused by an operator: the API says so, and the page too.
    await page.getByRole('button', { name: 'Pause often…' }).click();
    const dialog = page.getByRole('dialog');
    await dialog.getByRole('button', { name: 'Pause', exact: true }).click();
    await page.locator('#toast').getByText('often paused.').waitFor();
    assert.equal((await server.api('/v1/schedules/often')).paused, true);
    await page.locator('[data-next="often"]').getByText('paused').waitFor();

    // Its page: the runs, each with its saga, one click from the saga's page.
    await row('often').getByRole('link', { name: 'often' }).click();
    await page.waitForFunction(() => location.hash === '#/schedules/often');
    const runs = page.locator('table.runs tbody tr');
    await runs.first().waitFor();
    const shown = await server.api('/v1/schedules/often');
    assert.equal(await runs.count(), shown.runs.length);
    const saga = shown.runs[0].saga_id;
    await page.locator('table.runs').getByRole('link', { name: saga.slice(0, 8) }).first().click();
    await page.waitForFunction((id) => location.hash === `#/sagas/${id}`, saga);

    // Fired now from its page, and deleted from the list.
    await page.goto(`${server.base}/ui/#/schedules/nightly`);
    await page.getByRole('button', { name: 'Trigger nightly…' }).click();
    await dialog.getByRole('button', { name: 'Fire now' }).click();
    await page.locator('#toast').getByText(/nightly: started, saga /).waitFor();
    await page.locator('table.runs tbody tr').getByText('(trigger)').waitFor();
    await page.getByRole('button', { name: 'Delete nightly…' }).click();
    await dialog.getByRole('button', { name: 'Delete' }).click();
    await page.waitForFunction(() => location.hash === '#/schedules');
    await page.locator('tbody tr[data-schedule="often"]').waitFor();
    assert.equal(await page.locator('tbody tr[data-schedule="nightly"]').count(), 0);
    const { schedules } = await server.api('/v1/schedules');
    assert.deepEqual(schedules.map((s) => s.id), ['often']);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('a read-only token sees the schedules and no action', async () => {
  const server = await startServer({ tokens: true });
  try {
    await makeSchedules(server);
    await server.api('/v1/schedules/often/pause', { method: 'POST' });
    const { page, context, errors } = await signedIn(browser, server, '#/schedules', TOKENS.reader);
    await page.locator('tbody tr[data-schedule="nightly"]').waitFor();
    assert.equal(await page.locator('tbody tr').count(), 2);
    assert.equal(await page.getByRole('button', { name: /Pause|Resume|Trigger|Delete/ }).count(), 0, 'no action offered');
    assert.equal(await page.locator('thead th').count(), 6, 'no action column');
    await page.goto(`${server.base}/ui/#/schedules/nightly`);
    await page.locator('ol.next-runs li').first().waitFor();
    assert.equal(await page.locator('ol.next-runs li').count(), 5);
    assert.equal(await page.getByRole('button', { name: /Pause|Resume|Trigger|Delete/ }).count(), 0);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});
