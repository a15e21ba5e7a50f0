// Operator recovery in the web console (SPEC §13), in a real Chromium against a real server:
// a saga paused when its retries ran out and resumed through its button, a step completed by
// hand, a fork from a stage that supersedes its original, and a bulk action over sagas picked on
// the list, followed to its end on the job's page.
//
// Run with `npm test` here, after `cargo build -p example-sagas` (scripts/test.sh does both).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, start, waitFor, launchBrowser } from './harness.mjs';

let browser;
before(async () => {
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
});

async function open(server, hash = '') {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${server.base}/ui/${hash}`);
  return { page, context, errors };
}

/** Fills the open dialog's reason and presses its button named `submit`. */
async function confirm(page, submit, reason) {
  const dialog = page.getByRole('dialog');
  await dialog.getByLabel(/Reason/).fill(reason);
  await dialog.getByRole('button', { name: submit, exact: true }).click();
}

const items = [{ sku: 'sku-1', qty: 1 }];

test('a saga paused when its retries ran out says so, and its Resume button completes it', async () => {
  const server = await startServer();
  try {
    const id = await start(server, 'fulfil_order', {
      order_id: 'p-1', user: 'ada', amount: 10, items, simulate: { transient_failures: { charge_payment: 7 } },
    });
    await waitFor(server, id, (s) => s.status === 'PAUSED');
    const { page, context, errors } = await open(server, `#/sagas/${id}`);
    await page.locator('h1 .badge').filter({ hasText: 'PAUSED' }).waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'needs attention' }).waitFor();
    assert.match(await page.locator('[data-key="error"]').innerText(), /charge_payment/);
    assert.match(await page.locator('.meta').innerText(), /Paused since/i);
    assert.equal(await page.getByRole('button', { name: 'Pause…' }).count(), 0, 'a paused saga is not paused again');
    assert.equal(await page.getByRole('button', { name: 'Retry…' }).count(), 0, 'a paused saga is resumed, not retried');

    await page.getByRole('button', { name: 'Resume…' }).click();
    await confirm(page, 'Resume', 'the provider is back');
    await page.locator('#toast').getByText('Saga resumed').waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'COMPLETED' }).waitFor({ timeout: 20000 });
    const saga = await server.api(`/v1/sagas/${id}`);
    assert.equal(saga.steps.find((s) => s.name === 'charge_payment').attempts, 8);
    const { events } = await server.api(`/v1/sagas/${id}/events`);
    const resumed = events.find((e) => e.type === 'saga.resumed');
    assert.equal(resumed.data.reason, 'the provider is back');
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('Pause stops a sleeping saga where it is, and a FAILED step completed by hand lets its saga finish', async () => {
  const server = await startServer();
  try {
    const sleeping = await start(server, 'fulfil_order', { order_id: 'p-2', user: 'ada', amount: 10, items, cooling_off_ms: 600000 });
    const failed = await start(server, 'fulfil_order', { order_id: 'p-3', user: 'ada', amount: 10, items, simulate: { fail_step: 'notify_customer' } });
    await waitFor(server, sleeping, (s) => s.waiting_for === 'sleep');
    await waitFor(server, failed, (s) => s.status === 'FAILED');

    const { page, context, errors } = await open(server, `#/sagas/${sleeping}`);
    await page.getByRole('button', { name: 'Pause…' }).click();
    await confirm(page, 'Pause', 'hold shipping until Monday');
    await page.locator('#toast').getByText(/paused|Pause requested/).waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'PAUSED' }).waitFor({ timeout: 20000 });
    assert.equal((await server.api(`/v1/sagas/${sleeping}`)).lease_owner, null, 'a paused saga holds no lease');

    await page.goto(`${server.base}/ui/#/sagas/${failed}`);
    await page.getByRole('button', { name: 'Complete step…' }).click();
    const dialog = page.getByRole('dialog');
    const options = await dialog.getByLabel('Step').locator('option').evaluateAll((all) => all.map((o) => o.value));
    assert.deepEqual(options, ['notify_customer'], 'only the stage the saga stopped on');
    await dialog.getByLabel('Output (JSON)').fill('{"sent_by": "phone"}');
    await confirm(page, 'Complete the step', 'called the customer');
    await page.locator('#toast').getByText('notify_customer completed by hand').waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'COMPLETED' }).waitFor({ timeout: 20000 });
    const saga = await server.api(`/v1/sagas/${failed}`);
    assert.deepEqual(saga.steps.find((s) => s.name === 'notify_customer').output, { sent_by: 'phone' });
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('a fork from a stage opens the new saga, which links back, and the original says it is superseded', async () => {
  const server = await startServer();
  try {
    const original = await start(server, 'fulfil_order', { order_id: 'p-4', user: 'ada', amount: 10, items, cooling_off_ms: 600000 });
    await waitFor(server, original, (s) => s.waiting_for === 'sleep');
    await server.api(`/v1/sagas/${original}/abort`, { method: 'POST', body: { reason: 'stuck in cooling off' } });

    const { page, context, errors } = await open(server, `#/sagas/${original}`);
    await page.locator('h1 .badge').filter({ hasText: 'ABORTED' }).waitFor();
    await page.getByRole('button', { name: 'Fork…' }).click();
    const dialog = page.getByRole('dialog');
    const stages = await dialog.getByLabel('Start from stage').locator('option').evaluateAll((all) => all.map((o) => o.value));
    assert.deepEqual(stages, ['', 'charge_payment', 'await_approval', 'cooling_off'],
      'the first stage, or any stage whose earlier stages all took effect');
    await dialog.getByLabel('Start from stage').selectOption('cooling_off');
    const input = JSON.parse(await dialog.getByLabel('Input (JSON)').inputValue());
    input.cooling_off_ms = 0;
    await dialog.getByLabel('Input (JSON)').fill(JSON.stringify(input));
    await confirm(page, 'Fork', 'no cooling off for this order');
    await page.locator('#toast').getByText('Forked').waitFor();
    await page.waitForFunction((id) => location.hash.startsWith('#/sagas/') && !location.hash.includes(id), original);
    const forked = page.url().split('#/sagas/')[1];
    await page.locator('[data-key="forked-from"]').getByText(original.slice(0, 8)).waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'COMPLETED' }).waitFor({ timeout: 20000 });
    const again = await server.api(`/v1/sagas/${original}`);
    assert.equal(again.superseded_by, forked);
    await page.goto(`${server.base}/ui/#/sagas/${original}`);
    await page.locator('[data-key="superseded"]').waitFor();
    assert.equal(await page.getByRole('button', { name: 'Fork…' }).count(), 0, 'a superseded saga is not forked again');
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('sagas picked on the list are cancelled by one bulk job, whose page follows it to the end', async () => {
  const server = await startServer();
  try {
    const ids = [];
    for (let i = 0; i < 3; i++) {
      ids.push(await start(server, 'fulfil_order', { order_id: `b-${i}`, user: 'ada', amount: 10, items, cooling_off_ms: 600000 }));
    }
    for (const id of ids) await waitFor(server, id, (s) => s.waiting_for === 'sleep');
    const { page, context, errors } = await open(server);
    await page.locator(`tbody tr[data-key="${ids[2]}"]`).waitFor();
    await page.getByLabel(`Select ${ids[0]}`).check();
    await page.getByLabel(`Select ${ids[1]}`).check();
    await page.locator('#bulk-count').getByText('2 selected').waitFor();
    await page.getByLabel('Action', { exact: true }).selectOption('cancel');
    await page.getByRole('button', { name: 'Act on selected…' }).click();
    const dialog = page.getByRole('dialog');
    await dialog.getByText(/2 sagas now/).waitFor();
    await confirm(page, 'Start bulk cancel', 'orders withdrawn');
    await page.waitForFunction(() => location.hash.startsWith('#/bulk/'));
    await page.locator('h1 .badge').filter({ hasText: 'DONE' }).waitFor({ timeout: 20000 });
    assert.match(await page.locator('[data-key="progress"]').innerText(), /2 of 2 sagas handled/);
    for (const id of ids.slice(0, 2)) await waitFor(server, id, (s) => s.status === 'COMPENSATED');
    assert.equal((await server.api(`/v1/sagas/${ids[2]}`)).status, 'RUNNING', 'the saga not picked is left alone');
    await page.getByRole('link', { name: '← Bulk jobs' }).click();
    await page.locator('tbody tr').first().waitFor();
    assert.match(await page.locator('tbody tr').first().innerText(), /cancel/);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});
