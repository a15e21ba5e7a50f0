// The operator actions, each confirmed in a dialog and offered only where the server takes it.

import { STOPPED, FINISHED, PAUSABLE, state, route } from './state.js';
import { ApiError, api, can } from './api.js';
import { el, toast, field } from './ui.js';

// ---- operator actions ---------------------------------------------------------------------

/** A confirmation dialog; `run` gets the form's values and returns a message, or throws. */
export function confirmDialog({ title, text, fields = [], submit, danger = false, run }) {
  const error = el('p', { class: 'error-text', role: 'alert', hidden: true });
  const submitButton = el('button', { type: 'submit', class: danger ? 'danger' : 'primary' }, submit);
  const dialog = el('dialog', { 'aria-labelledby': 'dlg-title' });
  const close = () => { dialog.close(); dialog.remove(); };
  const form = el('form', {
    method: 'dialog',
    onsubmit: async (ev) => {
      ev.preventDefault();
      const values = Object.fromEntries(new FormData(form).entries());
      submitButton.disabled = true;
      error.hidden = true;
      try {
        const message = await run(values);
        close();
        toast(message);
        // The page is read again where it is, not rebuilt: the focus goes back to the
        // button that opened the dialog.
        if (state.refresh) state.refresh(); else route();
      } catch (e) {
        error.textContent = e instanceof ApiError ? `Refused: ${e.describe()}` : e.message;
        error.hidden = false;
        submitButton.disabled = false;
      }
    },
  },
  el('h2', { id: 'dlg-title', style: 'margin-top:0' }, title),
  text ? el('p', {}, text) : null,
  fields,
  error,
  el('div', { class: 'buttons' },
    el('button', { type: 'button', onclick: close }, 'Keep as is'),
    submitButton));
  dialog.append(form);
  dialog.addEventListener('cancel', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  const first = form.querySelector('textarea, input, select');
  (first || submitButton).focus();
}

/** A JSON text area's value, parsed, or an error naming the field. */
function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`The ${what} is not JSON: ${e.message}`);
  }
}

function reasonField() {
  return field('dlg-reason', 'Reason (kept in the saga\'s events, with your token\'s name)',
    el('textarea', { id: 'dlg-reason', name: 'reason', required: true, rows: 3 }));
}

/**
 * Whether a step's compensation still has to run, as the server decides it (needs_compensation
 * in the model): a compensatable step whose action succeeded or may have had an effect, or a
 * child stage that may have started its child, not yet undone or marked.
 */
function needsCompensation(step) {
  let started;
  if (step.kind === 'compensatable') started = step.outcome_unknown;
  else if (step.kind === 'child') started = step.status === 'WAITING';
  else return false;
  return (step.status === 'SUCCEEDED' || (started && step.status !== 'PENDING'))
    && !['SUCCEEDED', 'MANUAL'].includes(step.compensation.status);
}

/**
 * Whether the saga's point of no return (its pivot, or else its first retriable step) has
 * started, so that a cancel is refused: a stage at or after it has started. `pivot_reached`
 * says more: that it succeeded.
 */
function pivotStarted(saga) {
  if (saga.pivot_reached) return true;
  const pivot = saga.stages.find((s) => s.step_kind === 'pivot' || s.step_kind === 'retriable');
  return !!pivot && saga.stages.some((s) => s.index >= pivot.index && !['PENDING', 'SKIPPED'].includes(s.status));
}

/** Whether a stage's action is done: nothing of it will run again going forward. */
const settled = (r) => r.status === 'SUCCEEDED' || r.status === 'SKIPPED';

/**
 * The calls an operator may complete by hand (model::rules, check_complete_step): the stage a
 * saga is stopped on — the first one not done — or the branches of it that are not done, when
 * the saga is PAUSED or FAILED, or is parked on that stage without a call in flight (a retry
 * timer, a signal, a sleep). Never while compensating, never a child stage.
 */
function completable(saga) {
  if (FINISHED.has(saga.status) || saga.status === 'COMPENSATING') return [];
  const stage = saga.stages.find((s) => !settled(s));
  if (!stage || stage.kind === 'child') return [];
  const stopped = saga.status === 'PAUSED' || saga.status === 'FAILED';
  const rows = stage.branches && stage.branches.length ? stage.branches.filter((b) => !settled(b)) : [stage];
  return rows.filter((r) => stopped || r.status === 'RETRYING' || r.status === 'WAITING').map((r) => r.name);
}

/**
 * The stages a fork may start from (SPEC §13): while the original's effects stand (it is
 * PAUSED, ABORTED or COMPLETED and not superseded), any stage after the first whose earlier
 * stages all succeeded or were skipped and are not child stages.
 */
function forkStages(saga) {
  if (!['PAUSED', 'ABORTED', 'COMPLETED'].includes(saga.status) || saga.superseded_by) return [];
  const out = [];
  for (let i = 1; i < saga.stages.length; i++) {
    const before = saga.stages[i - 1];
    if (!settled(before) || before.kind === 'child') break;
    out.push(saga.stages[i].name);
  }
  return out;
}

/** A compensation a person should look at: failing, unknown, or running while the saga waits for one. */
function compensationStuck(step, saga) {
  const c = step.compensation.status;
  return ['FAILED', 'RETRYING', 'UNKNOWN'].includes(c) || (c === 'RUNNING' && saga.needs_attention);
}

export function actionBar(saga) {
  const bar = el('div', { class: 'actionbar', role: 'group', 'aria-label': 'Operator actions', dataset: { key: 'actions' } });
  const stopped = STOPPED.has(saga.status);
  const id = saga.id;
  const retrying = [];
  for (const stage of saga.stages) {
    for (const r of [stage, ...(stage.branches || [])]) {
      if (r.status === 'RETRYING' || r.compensation.status === 'RETRYING') retrying.push(r.name);
    }
  }
  // Offered only where the server accepts them (store/rules.rs), so that no button leads to a refusal.
  if (can('start') && !stopped && !pivotStarted(saga) && saga.status !== 'COMPENSATING') {
    bar.append(el('button', {
      type: 'button', class: 'danger', onclick: () => confirmDialog({
        title: 'Cancel this saga?',
        text: 'Everything it did so far is undone, in reverse order. It cannot be taken back.',
        submit: 'Cancel the saga', danger: true,
        run: async () => { await api(`/v1/sagas/${id}/cancel`, { method: 'POST' }); return 'Cancel requested: the saga is being compensated.'; },
      }),
    }, 'Cancel…'));
  }
  if (can('start') && !stopped && saga.status !== 'COMPENSATING') {
    const waiting = saga.stages.filter((s) => s.status === 'WAITING' && s.waiting_for).map((s) => s.waiting_for);
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Send a signal',
        text: waiting.length ? `The saga waits for: ${waiting.join(', ')}.` : 'A signal sent before the saga waits for it is kept until it does.',
        fields: [
          field('dlg-signal', 'Signal', el('input', { id: 'dlg-signal', name: 'signal', required: true, value: waiting[0] || '', autocomplete: 'off' })),
          field('dlg-payload', 'Payload (JSON)', el('textarea', { id: 'dlg-payload', name: 'payload', rows: 4 }, '{}')),
        ],
        submit: 'Send',
        run: async (v) => {
          let payload;
          try {
            payload = JSON.parse(v.payload || 'null');
          } catch (e) {
            throw new Error(`The payload is not JSON: ${e.message}`);
          }
          const r = await api(`/v1/sagas/${id}/signals/${encodeURIComponent(v.signal)}`, { method: 'POST', body: payload });
          return `Signal ${v.signal}: ${r && r.outcome ? r.outcome.replace('_', ' ') : 'sent'}.`;
        },
      }),
    }, 'Send signal…'));
  }
  if (can('operate') && (saga.status === 'FAILED' || (retrying.length && !stopped && saga.status !== 'PAUSED'))) {
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Retry now?',
        text: saga.status === 'FAILED' ? 'The failed step is attempted again, with the same idempotency key.'
          : `The waiting retry of ${retrying.join(', ')} is made now instead of at its time.`,
        submit: 'Retry now',
        run: async () => { await api(`/v1/sagas/${id}/retry`, { method: 'POST' }); return 'Retry requested.'; },
      }),
    }, 'Retry…'));
  }
  if (can('operate') && PAUSABLE.has(saga.status)) {
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Pause this saga?',
        text: 'Nothing new starts for it and its timers wait until it is resumed; a call in flight finishes and is recorded first.',
        fields: [reasonField()], submit: 'Pause',
        run: async (v) => {
          const after = await api(`/v1/sagas/${id}/pause`, { method: 'POST', body: { reason: v.reason } });
          return after && after.status === 'PAUSED' ? 'Saga paused.' : 'Pause requested: the call in flight finishes first.';
        },
      }),
    }, 'Pause…'));
  }
  if (can('operate') && saga.status === 'PAUSED') {
    bar.append(el('button', {
      type: 'button', class: 'primary', onclick: () => confirmDialog({
        title: 'Resume this saga?',
        text: 'It goes on where it stopped; a step whose retries ran out gets a fresh budget.',
        fields: [reasonField()], submit: 'Resume',
        run: async (v) => { await api(`/v1/sagas/${id}/resume`, { method: 'POST', body: { reason: v.reason } }); return 'Saga resumed.'; },
      }),
    }, 'Resume…'));
  }
  const byHand = completable(saga);
  if (can('operate') && byHand.length) {
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Complete a step by hand',
        text: 'Only when the step was done outside the saga: its output is recorded as if the step had returned it, the saga goes on, and the step\'s compensation, if ever needed, receives this output.',
        fields: [
          field('dlg-step', 'Step', el('select', { id: 'dlg-step', name: 'step' }, byHand.map((n) => el('option', { value: n }, n)))),
          field('dlg-output', 'Output (JSON)', el('textarea', { id: 'dlg-output', name: 'output', rows: 4 }, 'null')),
          reasonField(),
        ],
        submit: 'Complete the step',
        run: async (v) => {
          const output = parseJson(v.output || 'null', 'output');
          await api(`/v1/sagas/${id}/steps/${encodeURIComponent(v.step)}/complete`, { method: 'POST', body: { output, reason: v.reason } });
          return `${v.step} completed by hand.`;
        },
      }),
    }, 'Complete step…'));
  }
  if (can('operate') && !saga.superseded_by) {
    const from = forkStages(saga);
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Fork this saga',
        text: from.length
          ? 'A new saga of the same name runs with this input or the one given. From a later stage, it takes over the stages before it — their outputs and, if ever needed, their compensations — and this saga is aborted, superseded by it.'
          : 'A new saga of the same name runs from its first stage, with this input or the one given; this saga is left as it is.',
        fields: [
          from.length ? field('dlg-from', 'Start from stage', el('select', { id: 'dlg-from', name: 'from_stage' },
            el('option', { value: '' }, '(the first: run everything again)'),
            from.map((n) => el('option', { value: n }, n)))) : null,
          field('dlg-input', 'Input (JSON)', el('textarea', { id: 'dlg-input', name: 'input', rows: 6 }, JSON.stringify(saga.input, null, 2))),
          reasonField(),
        ],
        submit: 'Fork',
        run: async (v) => {
          const body = { reason: v.reason };
          const input = parseJson(v.input || 'null', 'input');
          if (JSON.stringify(input) !== JSON.stringify(saga.input)) body.input = input;
          if (v.from_stage) body.from_stage = v.from_stage;
          const forked = await api(`/v1/sagas/${id}/fork`, { method: 'POST', body });
          const next = forked.id || (forked.saga && forked.saga.id);
          if (next) setTimeout(() => { location.hash = `#/sagas/${next}`; }, 0);
          return `Forked: the new saga is ${next}.`;
        },
      }),
    }, 'Fork…'));
  }
  if (can('operate') && !FINISHED.has(saga.status)) {
    bar.append(el('button', {
      type: 'button', class: 'danger', onclick: () => confirmDialog({
        title: 'Abort this saga?',
        text: 'It stops where it is, without compensating: whatever it did stays done. A call in flight is recorded as abandoned.',
        fields: [reasonField()], submit: 'Abort', danger: true,
        run: async (v) => { await api(`/v1/sagas/${id}/abort`, { method: 'POST', body: { reason: v.reason } }); return 'Saga aborted.'; },
      }),
    }, 'Abort…'));
  }
  // Only while compensating, for the steps whose compensation is still to be done; the
  // stuck ones first.
  const markable = saga.status === 'COMPENSATING' ? saga.steps.filter(needsCompensation) : [];
  markable.sort((a, b) => Number(compensationStuck(b, saga)) - Number(compensationStuck(a, saga)));
  if (can('operate') && markable.length) {
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Mark a compensation as done by hand',
        text: 'Only when you have undone the step yourself: the saga then goes on compensating the steps before it.',
        fields: [
          field('dlg-step', 'Step', el('select', { id: 'dlg-step', name: 'step' }, markable.map((s) =>
            el('option', { value: s.name }, `${s.name} (undo ${s.compensation.status.toLowerCase()})`)))),
          reasonField(),
        ],
        submit: 'Mark compensated',
        run: async (v) => {
          await api(`/v1/sagas/${id}/steps/${encodeURIComponent(v.step)}/mark-compensated`, { method: 'POST', body: { reason: v.reason } });
          return `${v.step} marked compensated.`;
        },
      }),
    }, 'Mark compensated…'));
  }
  for (const button of bar.querySelectorAll('button')) button.dataset.focus = `action ${button.textContent}`;
  return bar.childElementCount ? bar : null;
}

// ---- bulk actions -------------------------------------------------------------------------

/**
 * Confirms a bulk action over `filter` (SPEC §13, POST /v1/bulk): a dry run first says how
 * many sagas it matches now; once started, the job's page shows its progress.
 */
export async function bulkDialog({ action, filter, what }) {
  let matched;
  try {
    matched = (await api('/v1/bulk', { method: 'POST', body: { action, filter, reason: `preview of a bulk ${action}`, dry_run: true } })).matched;
  } catch (e) {
    toast(e instanceof ApiError ? `Refused: ${e.describe()}` : e.message);
    return;
  }
  confirmDialog({
    title: `Bulk ${action}`,
    text: `${action[0].toUpperCase()}${action.slice(1)} ${what}: ${matched} saga${matched === 1 ? '' : 's'} now. `
      + 'Each is acted on once, in a job that goes on if the server restarts; those the action does not apply to are listed as refused.',
    fields: [reasonField()],
    submit: `Start bulk ${action}`,
    danger: action === 'cancel' || action === 'abort',
    run: async (v) => {
      const job = await api('/v1/bulk', { method: 'POST', body: { action, filter, reason: v.reason } });
      setTimeout(() => { location.hash = `#/bulk/${job.id}`; }, 0);
      return `Bulk ${action} started over ${job.matched} saga${job.matched === 1 ? '' : 's'}.`;
    },
  });
}
