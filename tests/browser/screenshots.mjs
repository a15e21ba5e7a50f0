// Regenerates the console screenshots in docs/ from a real server and Debian's Chromium:
//   cargo build -p example-sagas && (cd tests/browser && npm ci && npm run screenshots)
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, start, waitFor, launchBrowser } from './harness.mjs';

const docs = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', 'docs');
const server = await startServer();
try {
  const orders = [];
  for (let i = 1; i <= 6; i++) {
    orders.push(await start(server, 'place_order', { order_id: `o-${i}`, user: 'ada', amount: 100 * i }));
  }
  const undone = await start(server, 'place_order', {
    order_id: 'o-7', user: 'grace', amount: 1200,
    simulate: {
      fail_step: 'assign_rider', transient_failures: { charge_payment: 2 },
      compensation_failures: { charge_payment: 3 }, delay_ms: 40,
    },
  });
  const items = Array.from({ length: 12 }, (_, i) => ({ sku: `sku-${i + 1}`, qty: 1 + (i % 3) }));
  const branches = await start(server, 'fulfil_order', {
    order_id: 'f-1', user: 'ada', amount: 4200, items,
    simulate: { fail_step: 'reserve_items/sku-9', delay_ms: 30 },
  });
  const waiting = await start(server, 'fulfil_order', {
    order_id: 'f-2', user: 'alan', amount: 990, needs_approval: true, approval_timeout_s: 30,
    items: items.slice(0, 4), simulate: { delay_ms: 25 },
  });
  await waitFor(server, undone, (s) => s.status === 'COMPENSATED', 60_000);
  await waitFor(server, branches, (s) => s.status === 'COMPENSATED', 60_000);
  await waitFor(server, waiting, (s) => s.stages.some((st) => st.status === 'WAITING'), 60_000);

  const browser = await launchBrowser();
  const shoot = async (hash, file, viewport, prepare) => {
    const page = await browser.newPage({ viewport, deviceScaleFactor: 1 });
    await page.goto(`${server.base}/ui/${hash}`);
    await page.locator('main h1').waitFor();
    await page.waitForLoadState('networkidle');
    if (prepare) await prepare(page);
    await page.waitForTimeout(300);
    await page.screenshot({ path: join(docs, file) });
    await page.close();
    console.log(`docs/${file}`);
  };
  const desktop = { width: 1360, height: 860 };
  await shoot('', 'console-list.png', desktop);
  await shoot(`#/sagas/${undone}`, 'console-saga.png', desktop, async (page) => {
    await page.locator('.tl-grid .bar.compensation.failed').first().click();
  });
  await shoot(`#/sagas/${branches}`, 'console-branches.png', desktop);
  await shoot(`#/sagas/${waiting}`, 'console-signal.png', desktop, async (page) => {
    await page.getByRole('button', { name: 'Send signal…' }).click();
    await page.getByLabel('Payload (JSON)').fill('{"approved": true, "by": "grace"}');
  });
  await shoot(`#/sagas/${undone}`, 'console-phone.png', { width: 390, height: 844 });
  await browser.close();
} finally {
  await server.stop();
}
