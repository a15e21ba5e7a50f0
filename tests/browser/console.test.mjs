// The web console in a real Chromium against a real server: the list and its filters, a
// compensated saga's timeline checked against its attempt log, cancel and a signal through the
// buttons (and a refusal shown as the API said it), and tokens: asked for, kept for the tab
// only, a read-only one offered no action.
//
// Run with `npm test` here, after `cargo build -p example-sagas` (scripts/test.sh does both).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { startServer, start, waitFor, launchBrowser, TOKENS } from './harness.mjs';

const axePath = createRequire(import.meta.url).resolve('axe-core/axe.min.js');

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

const compensatedOrder = {
  order_id: 'o-2', user: 'ada', amount: 1200,
  simulate: { fail_step: 'assign_rider', transient_failures: { charge_payment: 1 } },
};

test('the list shows the sagas, filters them by status and opens one', async () => {
  const server = await startServer();
  try {
    const undone = await start(server, 'place_order', compensatedOrder);
    const done = await start(server, 'place_order', { order_id: 'o-1', user: 'ada', amount: 10 });
    await waitFor(server, undone, (s) => s.status === 'COMPENSATED');
    await waitFor(server, done, (s) => s.status === 'COMPLETED');
    const { page, context, errors } = await open(server);
    const rows = page.locator('tbody tr');
    await rows.nth(1).waitFor();
    assert.equal(await rows.count(), 2);
    assert.match(await page.locator('#counts').innerText(), /compensated 1/);

    await page.getByLabel('Status', { exact: true }).selectOption('COMPENSATED');
    await page.waitForFunction(() => document.querySelectorAll('tbody tr').length === 1);
    assert.match(page.url(), /status=COMPENSATED/);
    const link = page.locator('tbody tr a');
    assert.equal(await link.innerText(), undone);
    await link.click();
    await page.locator('h1 .badge').filter({ hasText: 'COMPENSATED' }).waitFor();
    assert.match(await page.locator('h1').innerText(), /place_order/);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('the list and a saga page use the server\'s words: what a saga waits for, which compensations will run', async () => {
  const server = await startServer();
  try {
    const undone = await start(server, 'place_order', compensatedOrder);
    const items = [{ sku: 'sku-1', qty: 1 }, { sku: 'sku-2', qty: 2 }];
    const parked = await start(server, 'fulfil_order', { order_id: 'f-2', user: 'ada', amount: 10, needs_approval: true, items });
    const sleeping = await start(server, 'fulfil_order', { order_id: 'f-3', user: 'ada', amount: 10, cooling_off_ms: 600000, items });
    await waitFor(server, undone, (s) => s.status === 'COMPENSATED');
    await waitFor(server, parked, (s) => s.waiting_for === 'signal:approval');
    await waitFor(server, sleeping, (s) => s.waiting_for === 'sleep' && s.wake_at);

    // The list's wait column says what the list's JSON says, and nothing for a saga that ended.
    const { sagas } = await server.api('/v1/sagas');
    assert.deepEqual(sagas.map((s) => s.waiting_for).sort(), [null, 'signal:approval', 'sleep']);
    const list = await open(server);
    await list.page.locator(`tbody tr[data-key="${sleeping}"]`).waitFor();
    for (const s of sagas) {
      const cell = (await list.page.locator(`tbody tr[data-key="${s.id}"] td.waiting`).first().innerText()).trim();
      if (s.waiting_for) assert.ok(cell.startsWith(s.waiting_for), `${s.id}: ${cell}`);
      else assert.equal(cell, '', s.id);
    }
    assert.match(await list.page.locator(`tbody tr[data-key="${sleeping}"] td.waiting`).first().innerText(), /^sleep until /);
    assert.deepEqual(list.errors, []);
    await list.context.close();

    // A saga's page: each stage's and branch's undo status is the server's word.
    for (const id of [undone, parked]) {
      const saga = await server.api(`/v1/sagas/${id}`);
      const { page, context, errors } = await open(server, `#/sagas/${id}`);
      const rows = page.locator('section[data-key="stages"] tbody tr');
      await rows.first().waitFor();
      const shown = await rows.evaluateAll((all) => all.map((r) => [r.dataset.key, r.children[5].innerText.trim()]));
      const expected = saga.stages.flatMap((st) => [
        [st.name, st.compensation.status], ...(st.branches || []).map((b) => [b.name, b.compensation.status])]);
      assert.deepEqual(shown, expected);
      assert.ok(shown.every(([, w]) => w !== 'NONE'), JSON.stringify(shown));
      assert.ok(shown.some(([, w]) => w === 'NOT_NEEDED'), JSON.stringify(shown));
      if (id === parked) {
        assert.deepEqual(shown.find(([name]) => name === 'charge_payment'), ['charge_payment', 'PENDING'],
          'the charge is refunded should the saga go back');
        assert.match(await page.locator('h1').innerText(), /waiting for signal:approval/);
      } else {
        assert.ok(shown.every(([, w]) => w !== 'PENDING'), 'a compensated saga has nothing left to undo');
      }
      assert.deepEqual(errors, []);
      await context.close();
    }
  } finally {
    await server.stop();
  }
});

test('a compensated saga has a lane per stage and a bar per attempt of its log', async () => {
  const server = await startServer();
  try {
    const id = await start(server, 'place_order', compensatedOrder);
    await waitFor(server, id, (s) => s.status === 'COMPENSATED');
    const { attempts } = await server.api(`/v1/sagas/${id}/attempts`);
    const { page, context, errors } = await open(server, `#/sagas/${id}`);
    await page.locator('.tl-row[data-lane="assign_rider"]').waitFor();

    const lanes = await page.locator('.tl-row[data-lane]').evaluateAll(
      (rows) => rows.map((r) => [r.dataset.lane, r.dataset.status]));
    assert.deepEqual(lanes, [
      ['reserve_stock', 'SUCCEEDED'], ['charge_payment', 'SUCCEEDED'], ['assign_rider', 'FAILED'],
    ]);
    const bars = await page.locator('.bar[data-lane]').evaluateAll((all) => all.map((b) => ({
      step: b.dataset.lane, phase: b.dataset.phase, attempt: Number(b.dataset.attempt), outcome: b.dataset.outcome,
      failed: b.classList.contains('failed'), compensation: b.classList.contains('compensation'),
    })));
    assert.equal(bars.length, attempts.length, 'one bar per attempt');
    for (const a of attempts) {
      const bar = bars.find((b) => b.step === a.step && b.phase === a.phase && b.attempt === a.attempt);
      assert.ok(bar, `${a.step} ${a.phase} #${a.attempt} has a bar`);
      assert.equal(bar.outcome, a.outcome);
      assert.equal(bar.failed, a.outcome === 'failed' || a.outcome === 'retryable');
      assert.equal(bar.compensation, a.phase === 'compensation');
    }
    assert.equal(bars.filter((b) => b.compensation).length, 2, 'refund and release');
    assert.equal(bars.filter((b) => b.failed).length, 2, 'the transient charge failure and the rider');

    // A bar tells its attempt: outcome, error, worker.
    await page.locator('.bar[data-lane="assign_rider"]').click();
    const details = page.locator('#attempt-details');
    await details.getByText('no rider within 5 km').waitFor();
    assert.match(await details.innerText(), /Worker/);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('cancel through its button compensates a sleeping saga', async () => {
  const server = await startServer();
  try {
    const id = await start(server, 'fulfil_order', {
      order_id: 'f-1', user: 'ada', amount: 4200, cooling_off_ms: 600000,
      items: [{ sku: 'sku-1', qty: 1 }],
    });
    await waitFor(server, id, (s) => s.stages.some((st) => st.name === 'cooling_off' && st.status === 'WAITING'));
    const { page, context, errors } = await open(server, `#/sagas/${id}`);
    await page.locator('.tl-row[data-lane="cooling_off"][data-status="WAITING"]').waitFor();
    await page.getByRole('button', { name: 'Cancel…' }).click();
    const dialog = page.getByRole('dialog');
    await dialog.getByText('Cancel this saga?').waitFor();
    await dialog.getByRole('button', { name: 'Cancel the saga' }).click();
    await page.locator('#toast').getByText('Cancel requested').waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'COMPENSATED' }).waitFor({ timeout: 20000 });
    assert.equal((await server.api(`/v1/sagas/${id}`)).status, 'COMPENSATED');
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('a signal sent through its button lets the saga go on, and a refused one shows why', async () => {
  const server = await startServer();
  try {
    const id = await start(server, 'fulfil_order', {
      order_id: 'f-2', user: 'ada', amount: 4200, needs_approval: true,
      items: [{ sku: 'sku-1', qty: 1 }, { sku: 'sku-2', qty: 2 }],
    });
    await waitFor(server, id, (s) => s.stages.some((st) => st.status === 'WAITING'));
    const { page, context, errors } = await open(server, `#/sagas/${id}`);
    await page.locator('.tl-row[data-lane="await_approval"][data-status="WAITING"]').waitFor();

    // One the saga does not wait for: the API's 404 is shown, and nothing changes.
    await page.getByRole('button', { name: 'Send signal…' }).click();
    let dialog = page.getByRole('dialog');
    await dialog.getByLabel('Signal').fill('no_such_signal');
    await dialog.getByRole('button', { name: 'Send' }).click();
    await dialog.getByRole('alert').getByText(/Refused: 404/).waitFor();
    await dialog.getByRole('button', { name: 'Keep as is' }).click();

    await page.getByRole('button', { name: 'Send signal…' }).click();
    dialog = page.getByRole('dialog');
    assert.equal(await dialog.getByLabel('Signal').inputValue(), 'approval', 'the awaited signal is offered');
    await dialog.getByLabel('Payload (JSON)').fill('{"approved": true, "by": "grace"}');
    await dialog.getByRole('button', { name: 'Send' }).click();
    await page.locator('#toast').getByText('Signal approval: received').waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'COMPLETED' }).waitFor({ timeout: 20000 });
    const saga = await server.api(`/v1/sagas/${id}`);
    assert.equal(saga.status, 'COMPLETED');
    assert.deepEqual(saga.stages.find((s) => s.name === 'await_approval').output, { approved: true, by: 'grace' });
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('with tokens the console asks for one, keeps it for the tab only, and a read-only one sees no action', async () => {
  const server = await startServer({ tokens: true });
  try {
    const id = await start(server, 'fulfil_order', {
      order_id: 'f-3', user: 'ada', amount: 100, needs_approval: true, items: [{ sku: 'a', qty: 1 }],
    });
    await waitFor(server, id, (s) => s.stages.some((st) => st.status === 'WAITING'));
    const { page, context, errors } = await open(server, `#/sagas/${id}`);
    const token = page.getByLabel('API token');
    await token.fill('not-a-token');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByText('This token is not accepted').waitFor();

    await token.fill(TOKENS.reader);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator('.tl-row[data-lane="await_approval"]').waitFor();
    assert.match(await page.locator('#who').innerText(), /viewer \(read\)/);
    assert.equal(await page.locator('.actionbar').count(), 0, 'a read-only token sees no action');
    assert.ok(!page.url().includes(TOKENS.reader), 'the token is never in the URL');
    assert.deepEqual(await context.cookies(), [], 'nor in a cookie');
    assert.equal(await page.evaluate(() => localStorage.length), 0, 'nor kept beyond the tab');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('saga-console-token')), TOKENS.reader);

    // Another tab starts without it.
    const other = await context.newPage();
    await other.goto(`${server.base}/ui/`);
    await other.getByLabel('API token').waitFor();
    await other.close();

    await page.getByRole('button', { name: 'Sign out' }).click();
    await token.fill(TOKENS.admin);
    await page.getByRole('button', { name: 'Sign in' }).click();
    for (const name of ['Cancel…', 'Send signal…', 'Abort…']) {
      await page.getByRole('button', { name }).waitFor();
    }
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('a group of 64 branches is folded into one lane until asked for', async () => {
  const server = await startServer();
  try {
    const items = Array.from({ length: 64 }, (_, i) => ({ sku: `sku-${i}`, qty: 1 }));
    const id = await start(server, 'fulfil_order', {
      order_id: 'f-64', user: 'ada', amount: 100, items, simulate: { fail_step: 'reserve_items/sku-40' },
    });
    await waitFor(server, id, (s) => s.status === 'COMPENSATED');
    const { page, context, errors } = await open(server, `#/sagas/${id}`);
    const toggle = page.locator('.tl-row[data-lane="reserve_items"] button.toggle');
    await toggle.waitFor();
    assert.equal(await page.locator('.tl-row.branch').count(), 0, 'folded');
    // Folded, its lane still says what needs looking at, in words on the lane itself.
    const summary = page.locator('.tl-row[data-lane="reserve_items"] .group-sum');
    assert.equal(await summary.innerText(), '✕ 1 failed');
    assert.ok(await summary.isVisible());
    await toggle.click();
    await page.locator('.tl-row.branch').nth(63).waitFor();
    assert.equal(await page.locator('.tl-row.branch').count(), 64);
    assert.equal(await page.locator('.tl-row[data-lane="reserve_items/sku-40"] .bar.failed').count(), 1);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('the list and a saga page pass the WCAG 2.1 AA checks of axe, and the timeline works from the keyboard', async () => {
  const server = await startServer();
  try {
    const id = await start(server, 'place_order', compensatedOrder);
    await waitFor(server, id, (s) => s.status === 'COMPENSATED');
    // axe is injected as a script, which the console's own policy forbids: this context only.
    const context = await browser.newContext({ bypassCSP: true, viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    for (const hash of ['', `#/sagas/${id}`]) {
      await page.goto(`${server.base}/ui/${hash}`);
      await page.locator(hash ? '.tl-row[data-lane]' : 'tbody tr').first().waitFor();
      await page.addScriptTag({ path: axePath });
      const result = await page.evaluate(() => window.axe.run(document, { runOnly: ['wcag2a', 'wcag2aa', 'wcag21aa'] }));
      const violations = result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
      assert.deepEqual(violations, [], hash || 'the list');
    }
    // A bar is a button: focused, it opens with Enter.
    const bar = page.locator('.bar[data-lane="assign_rider"]');
    await bar.focus();
    await page.keyboard.press('Enter');
    await page.locator('#attempt-details').getByText('no rider within 5 km').waitFor();
    await context.close();
  } finally {
    await server.stop();
  }
});

test("keyboard focus stays where it was while a running saga's page updates itself", async () => {
  const server = await startServer();
  try {
    const id = await start(server, 'fulfil_order', {
      order_id: 'f-k', user: 'ada', amount: 10, needs_approval: true, items: [{ sku: 'a', qty: 1 }],
    });
    await waitFor(server, id, (s) => s.stages.some((st) => st.status === 'WAITING'));
    const { page, context, errors } = await open(server, `#/sagas/${id}`);
    await page.getByRole('button', { name: 'Send signal…' }).waitFor();
    // Reached with Tab alone, from the top of the page.
    let focused = null;
    for (let i = 0; i < 80 && focused !== 'action Send signal…'; i++) {
      await page.keyboard.press('Tab');
      focused = await page.evaluate(() => document.activeElement?.dataset?.focus ?? null);
    }
    assert.equal(focused, 'action Send signal…');
    // Several polls later (every 2 s), the same button still has the focus.
    await page.waitForTimeout(4500);
    assert.equal(await page.evaluate(() => document.activeElement?.dataset?.focus ?? null), 'action Send signal…');
    await page.keyboard.press('Enter');
    await page.getByRole('dialog').getByText('Send a signal').waitFor();
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

/** Counts the DOM changes under `selector` until `stop()`; the page keeps them in `window.__changes`. */
async function watchChanges(page, selector) {
  await page.evaluate((sel) => {
    window.__changes = 0;
    const observer = new MutationObserver((list) => { window.__changes += list.length; });
    for (const node of document.querySelectorAll(sel)) {
      observer.observe(node, { subtree: true, childList: true, attributes: true, characterData: true });
    }
    window.__observer = observer;
  }, selector);
  return async () => page.evaluate(() => { window.__observer.disconnect(); return window.__changes; });
}

test("a FAILED saga's timeline ends at its last activity, and mark-compensated is offered only where the server takes it", async () => {
  const server = await startServer();
  try {
    const failed = await start(server, 'fulfil_order', {
      order_id: 'f-f', user: 'ada', amount: 10, items: [{ sku: 'a', qty: 1 }], simulate: { fail_step: 'notify_customer' },
    });
    const stuck = await start(server, 'place_order', {
      order_id: 'o-s', user: 'ada', amount: 10, simulate: { fail_step: 'assign_rider', compensation_failures: { charge_payment: 100000 } },
    });
    await waitFor(server, failed, (s) => s.status === 'FAILED');
    const { page, context, errors } = await open(server, `#/sagas/${failed}`);
    await page.locator('h1 .badge').filter({ hasText: 'FAILED' }).waitFor();
    await page.locator('.bar[data-lane="notify_customer"]').waitFor();
    const header = await page.locator('.meta').innerText();
    assert.doesNotMatch(header, /Running for/i, 'a FAILED saga is not running');
    assert.match(header, /Waiting for an operator since/i);
    assert.equal(await page.locator('.nowline').count(), 0, 'no now-line: its time does not go on');
    // Its last call ends near the right edge, and stays there as time goes by.
    const edge = () => page.evaluate(() => {
      const bar = document.querySelector('.bar[data-lane="notify_customer"]').getBoundingClientRect();
      const track = document.querySelector('.tl-row[data-lane="notify_customer"] .tl-track').getBoundingClientRect();
      return (bar.right - track.left) / track.width;
    });
    const first = await edge();
    assert.ok(first > 0.9, `the last attempt ends at ${first} of the axis`);
    await page.waitForTimeout(2500);
    assert.equal(await edge(), first, 'the axis does not grow');
    for (const name of ['Retry…', 'Abort…']) await page.getByRole('button', { name }).waitFor();
    assert.equal(await page.getByRole('button', { name: 'Mark compensated…' }).count(), 0,
      'the server refuses mark-compensated unless the saga is COMPENSATING');

    // A compensation that keeps failing: offered, for the steps still to undo, the stuck one first.
    await waitFor(server, stuck, (s) => s.steps.find((x) => x.name === 'charge_payment').compensation.status === 'RETRYING');
    await page.goto(`${server.base}/ui/#/sagas/${stuck}`);
    await page.getByRole('button', { name: 'Mark compensated…' }).click();
    const dialog = page.getByRole('dialog');
    const options = await dialog.getByLabel('Step').locator('option').evaluateAll((all) => all.map((o) => o.value));
    assert.deepEqual(options, ['charge_payment', 'reserve_stock'], 'not assign_rider, whose action failed');
    await dialog.getByLabel(/Reason/).fill('refunded by hand');
    await dialog.getByRole('button', { name: 'Mark compensated' }).click();
    await page.locator('#toast').getByText('charge_payment marked compensated').waitFor();
    await page.locator('h1 .badge').filter({ hasText: 'COMPENSATED' }).waitFor({ timeout: 20000 });
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('an undo whose outcome is unknown still looks like an undo, not like an action', async () => {
  const server = await startServer();
  try {
    const slow = { order_id: 'o-u', user: 'ada', amount: 10, simulate: { fail_step: 'assign_rider', delay_ms: 1500 } };
    // Aborted while an action runs, and while a compensation runs: both calls are abandoned.
    const action = await start(server, 'place_order', { ...slow, order_id: 'o-ua' });
    const undo = await start(server, 'place_order', slow);
    const abort = (id) => server.api(`/v1/sagas/${id}/abort`, { method: 'POST', body: { reason: 'test' } });
    await waitFor(server, action, (s) => s.steps[0].status === 'RUNNING', 30_000);
    await abort(action);
    await waitFor(server, undo, (s) => s.steps[1].compensation.status === 'RUNNING', 30_000);
    await abort(undo);
    const look = async (id, phase) => {
      const { page, context, errors } = await open(server, `#/sagas/${id}`);
      const bar = page.locator(`.bar[data-phase="${phase}"][data-outcome="abandoned"]`);
      await bar.waitFor();
      const seen = await bar.evaluate((b) => ({
        classes: [...b.classList], background: getComputedStyle(b).backgroundImage,
        color: getComputedStyle(b).backgroundColor, mark: b.textContent,
      }));
      assert.equal(await page.locator('.nowline').count(), 0, 'an aborted saga has no now-line');
      assert.deepEqual(errors, []);
      await context.close();
      return seen;
    };
    const a = await look(action, 'action');
    const c = await look(undo, 'compensation');
    assert.ok(a.classes.includes('unknown') && c.classes.includes('unknown'), 'both are marked unknown');
    assert.match(c.background, /135deg/, 'an undo keeps its diagonal stripes');
    assert.doesNotMatch(a.background, /135deg/, 'an action has none');
    assert.notEqual(a.background, c.background);
    assert.equal(a.mark, '?');
    assert.equal(c.mark, '↩?');
  } finally {
    await server.stop();
  }
});

test('live updates keep focus, scroll positions and a selection, and change nothing when nothing changed', async () => {
  const server = await startServer();
  try {
    const items = Array.from({ length: 12 }, (_, i) => ({ sku: `s-${i}`, qty: 1 }));
    const waiting = () => start(server, 'fulfil_order', { order_id: 'f-l', user: 'ada', amount: 10, needs_approval: true, items });
    const isWaiting = (s) => s.stages.some((st) => st.name === 'await_approval' && st.status === 'WAITING');
    const approve = (id) => server.api(`/v1/sagas/${id}/signals/approval`, { method: 'POST', body: { approved: true, by: 'test' } });
    const first = await waiting();
    const second = await waiting();
    const done = await start(server, 'place_order', compensatedOrder);
    await waitFor(server, first, isWaiting);
    await waitFor(server, second, isWaiting);
    await waitFor(server, done, (s) => s.status === 'COMPENSATED');

    // An ended saga's page: nothing is drawn again while nothing changes.
    const { page, context, errors } = await open(server, `#/sagas/${done}`);
    await page.locator('.bar[data-lane="assign_rider"]').waitFor();
    let stop = await watchChanges(page, 'main, #counts');
    await page.waitForTimeout(4500);
    assert.equal(await stop(), 0, 'an unchanged saga is not drawn again');

    // A waiting saga: its panels stay as they are until it changes.
    await page.goto(`${server.base}/ui/#/sagas/${first}`);
    await page.locator('.tl-row[data-lane="await_approval"][data-status="WAITING"]').waitFor();
    stop = await watchChanges(page, '.panels');
    await page.waitForTimeout(4500);
    assert.equal(await stop(), 0, 'events and stages are not drawn again');

    // Focus on a bar, the events scrolled: the saga goes on, and both stay as they were.
    const events = page.getByRole('region', { name: 'Events' });
    await events.evaluate((n) => { n.scrollTop = 60; window.__events = n; });
    const bar = page.locator('.bar[data-lane="charge_payment"]');
    await bar.focus();
    await bar.evaluate((n) => { window.__bar = n; });
    const before = await page.locator('h2', { hasText: /^Events/ }).innerText();
    await approve(first);
    await page.locator('h1 .badge').filter({ hasText: 'COMPLETED' }).waitFor({ timeout: 20000 });
    await page.waitForFunction((text) => [...document.querySelectorAll('h2')].some((h) => h.textContent.startsWith('Events') && h.textContent !== text), before);
    assert.ok(await page.evaluate(() => document.activeElement === window.__bar), 'the same bar keeps the focus');
    assert.ok(await page.evaluate(() => document.contains(window.__events) && window.__events.scrollTop === 60), 'the events keep their scroll position');

    // Text selected in the events: they wait until it is let go.
    await page.goto(`${server.base}/ui/#/sagas/${second}`);
    await page.locator('.tl-row[data-lane="await_approval"][data-status="WAITING"]').waitFor();
    const heading = page.locator('h2', { hasText: /^Events/ });
    const count = await heading.innerText();
    await page.evaluate(() => {
      const cell = document.querySelector('[aria-label="Events"] tbody tr td:nth-child(3)');
      document.getSelection().selectAllChildren(cell);
    });
    await approve(second);
    await page.locator('h1 .badge').filter({ hasText: 'COMPLETED' }).waitFor({ timeout: 20000 });
    await page.waitForTimeout(2500);
    assert.equal(await heading.innerText(), count, 'not drawn under a selection');
    assert.ok(await page.evaluate(() => document.getSelection().toString().length > 0), 'the selection is still there');
    await page.evaluate(() => document.getSelection().removeAllRanges());
    await page.waitForFunction((text) => [...document.querySelectorAll('h2')].some((h) => h.textContent.startsWith('Events') && h.textContent !== text), count, { timeout: 10000 });

    // The list: a count link and a saga link keep the focus as the list changes.
    await page.goto(`${server.base}/ui/`);
    await page.locator('tbody tr').nth(2).waitFor();
    stop = await watchChanges(page, 'main, #counts');
    await page.waitForTimeout(5500);
    assert.equal(await stop(), 0, 'an unchanged list is not drawn again');
    const chip = page.locator('#counts a[href="#/?status=COMPLETED"]');
    await chip.focus();
    await chip.evaluate((n) => { window.__chip = n; });
    const completed = await start(server, 'place_order', { order_id: 'o-n', user: 'ada', amount: 10 });
    await waitFor(server, completed, (s) => s.status === 'COMPLETED');
    await page.waitForFunction(() => window.__chip.textContent === 'completed 3', null, { timeout: 15000 });
    assert.ok(await page.evaluate(() => document.activeElement === window.__chip), 'the count link keeps the focus');
    const link = page.locator(`tbody a[href="#/sagas/${first}"]`).first();
    await link.focus();
    await link.evaluate((n) => { window.__link = n; });
    const another = await start(server, 'place_order', { order_id: 'o-m', user: 'ada', amount: 10 });
    await page.locator(`tbody a[href="#/sagas/${another}"]`).waitFor({ timeout: 15000 });
    assert.ok(await page.evaluate(() => document.activeElement === window.__link), 'the saga link keeps the focus');
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('the list filters by search attributes, kept in the URL, shows them, and a saga shows its own', async () => {
  const server = await startServer();
  try {
    const ada = await start(server, 'place_order', { order_id: 'o-a1', user: 'ada', amount: 10 });
    const ada2 = await start(server, 'place_order', { order_id: 'o-a2', user: 'ada', amount: 10 });
    const grace = await start(server, 'place_order', { order_id: 'o-g1', user: 'grace', amount: 10 });
    for (const id of [ada, ada2, grace]) await waitFor(server, id, (s) => s.status === 'COMPLETED');
    const { page, context, errors } = await open(server);
    const rows = page.locator('tbody tr');
    await rows.nth(2).waitFor();
    assert.match(await page.locator(`tbody tr[data-key="${grace}"] td.attrs`).innerText(), /user=grace/);

    const attrs = page.locator('#f-attr');
    await attrs.fill('user=ada');
    await attrs.press('Enter');
    await page.waitForFunction(() => location.hash.includes('attr=user%3Dada'));
    await page.waitForFunction(() => document.querySelectorAll('tbody tr').length === 2);
    assert.deepEqual((await page.locator('tbody tr').evaluateAll((all) => all.map((r) => r.dataset.key))).sort(), [ada, ada2].sort());

    // Two attributes: both must match. The filter survives a reload from the URL.
    await attrs.fill('user=ada, order_id=o-a2');
    await attrs.press('Enter');
    await page.waitForFunction(() => document.querySelectorAll('tbody tr').length === 1);
    await page.reload();
    await page.locator(`tbody tr[data-key="${ada2}"]`).waitFor();
    assert.equal(await page.locator('tbody tr').count(), 1);
    assert.equal(await page.locator('#f-attr').inputValue(), 'user=ada, order_id=o-a2');

    // A malformed name is refused beside the field.
    await page.locator('#f-attr').fill('User=ada');
    await page.locator('#f-attr').press('Enter');
    const problem = page.locator('#f-attr-error');
    await problem.waitFor();
    assert.match(await problem.innerText(), /400.*attr\.User/);

    // A saga's page shows its attributes, each a link to the sagas sharing it.
    await page.goto(`${server.base}/ui/#/sagas/${grace}`);
    const shown = page.locator('[data-key="attrs"] dd');
    await shown.waitFor();
    assert.match(await shown.innerText(), /order_id=o-g1/);
    await page.locator('[data-key="attrs"] a', { hasText: 'user=grace' }).click();
    await page.waitForFunction(() => location.hash.includes('attr=user%3Dgrace'));
    await page.locator(`tbody tr[data-key="${grace}"]`).waitFor();
    await page.waitForFunction(() => document.querySelectorAll('tbody tr').length === 1);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test('a filter changed stays focused and applies without leaving the form; a refused one is shown beside its field', async () => {
  const server = await startServer();
  try {
    const done = await start(server, 'place_order', { order_id: 'o-1', user: 'ada', amount: 10 });
    const undone = await start(server, 'place_order', compensatedOrder);
    const waiting = await start(server, 'fulfil_order', { order_id: 'f-w', user: 'ada', amount: 10, needs_approval: true, items: [{ sku: 'a', qty: 1 }] });
    await waitFor(server, done, (s) => s.status === 'COMPLETED');
    await waitFor(server, undone, (s) => s.status === 'COMPENSATED');
    await waitFor(server, waiting, (s) => s.stages.some((st) => st.status === 'WAITING'));
    const { page, context, errors } = await open(server);
    const rows = page.locator('tbody tr');
    await rows.nth(2).waitFor();
    const focused = () => page.evaluate(() => document.activeElement.id);

    // Arrowing through the statuses: each applies, and the arrows go on working.
    await page.locator('#f-status').focus();
    await page.keyboard.press('ArrowDown');
    await page.waitForFunction(() => location.hash.includes('status=QUEUED'));
    assert.equal(await focused(), 'f-status');
    await page.keyboard.press('ArrowDown');
    await page.waitForFunction(() => location.hash.includes('status=RUNNING'));
    await page.waitForFunction(() => document.querySelectorAll('tbody tr').length === 1);
    assert.equal(await focused(), 'f-status');
    await page.keyboard.press('ArrowUp');
    await page.keyboard.press('ArrowUp');
    await page.waitForFunction(() => !location.hash.includes('status='));
    await rows.nth(2).waitFor();

    // A check box.
    await page.locator('#f-attention').focus();
    await page.keyboard.press('Space');
    await page.waitForFunction(() => location.hash.includes('needs_attention=1'));
    assert.equal(await focused(), 'f-attention');
    await page.keyboard.press('Space');
    await page.waitForFunction(() => !location.hash.includes('needs_attention'));

    // Typed text applies on Enter, not at each key.
    const name = page.locator('#f-name');
    await name.focus();
    await page.keyboard.type('fulfil_ord');
    await page.waitForTimeout(600);
    assert.ok(!page.url().includes('name='), 'a partial name is not applied');
    await page.keyboard.type('er');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => location.hash.includes('name=fulfil_order'));
    await page.waitForFunction(() => document.querySelectorAll('tbody tr').length === 1);
    assert.equal(await focused(), 'f-name');
    assert.deepEqual(await page.locator('#f-names option').evaluateAll((all) => all.map((o) => o.value)),
      ['book_trip', 'fulfil_order', 'payout', 'place_order'], 'the known names are suggested');
    await name.fill('');
    await page.keyboard.press('Enter');
    await rows.nth(2).waitFor();

    // A date: applied on Enter once complete.
    await page.locator('#f-after').fill('2000-01-01T10:00');
    await page.waitForTimeout(600);
    assert.ok(!page.url().includes('after='), 'not before Enter');
    await page.locator('#f-after').press('Enter');
    await page.waitForFunction(() => location.hash.includes('after='));
    assert.equal(await focused(), 'f-after');

    // An id prefix the API refuses: said beside the field, the form still usable.
    const id = page.locator('#f-id');
    await id.fill('zz');
    await id.press('Enter');
    const problem = page.locator('#f-id-error');
    await problem.waitFor();
    assert.match(await problem.innerText(), /400.*id_prefix/);
    assert.equal(await id.getAttribute('aria-invalid'), 'true');
    assert.equal(await focused(), 'f-id');
    await id.fill(undone.slice(0, 8));
    await id.press('Enter');
    await page.waitForFunction(() => document.querySelector('#f-id-error').hidden);
    await page.locator(`tbody a[href="#/sagas/${undone}"]`).waitFor();
    assert.equal(await id.getAttribute('aria-invalid'), null);
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    await server.stop();
  }
});

test("sagas started together are told apart by their short ids, a running one's time is read on the server's clock, and a failed refresh says so", async () => {
  const server = await startServer();
  let stopped = false;
  try {
    const input = { order_id: 'o-t', user: 'ada', amount: 10, needs_approval: true, items: [{ sku: 'a', qty: 1 }] };
    const ids = [await start(server, 'fulfil_order', input), await start(server, 'fulfil_order', input)];
    for (const id of ids) await waitFor(server, id, (s) => s.stages.some((st) => st.status === 'WAITING'));
    // A browser whose clock is an hour fast.
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.clock.install({ time: Date.now() + 3_600_000 });
    const titles = [];
    for (const id of ids) {
      await page.goto(`${server.base}/ui/#/sagas/${id}`);
      await page.waitForFunction((short) => document.title.includes(short), `${id.slice(0, 8)}…${id.slice(-4)}`);
      titles.push(await page.title());
    }
    assert.notEqual(titles[0], titles[1]);
    await page.locator('.tl-row[data-lane="await_approval"]').waitFor();
    await page.waitForTimeout(2500);
    const lived = await page.locator('.meta div', { hasText: 'Running for' }).locator('dd').innerText();
    assert.match(lived, /^\d+(\.\d+)? (ms|s)$/, `running for ${lived}, not an hour`);

    await server.stop();
    stopped = true;
    const notice = page.getByRole('status').filter({ hasText: 'Could not refresh' });
    await notice.waitFor({ timeout: 10000 });
    assert.match(await notice.innerText(), /showing the data from/);
    await page.locator('.tl-row[data-lane="await_approval"]').waitFor(); // still shown
    assert.deepEqual(errors, []);
    await context.close();
  } finally {
    if (!stopped) await server.stop();
  }
});
