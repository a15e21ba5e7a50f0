// The operator actions, each confirmed in a dialog and offered only where the server takes it.

import { STOPPED, FINISHED, state, route } from './state.js';
import { ApiError, api, can } from './api.js';
import { el, toast, field } from './ui.js';

// ---- operator actions ---------------------------------------------------------------------

/** A confirmation dialog; `run` gets the form's values and returns a message, or throws. */
function confirmDialog({ title, text, fields = [], submit, danger = false, run }) {
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
  if (can('operate') && (saga.status === 'FAILED' || (retrying.length && !stopped))) {
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
