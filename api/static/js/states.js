// Job states and which of them are terminal, as the server defines them
// (api/states.py); it renders them into the page, so this list is never a copy.

const rendered = JSON.parse(document.getElementById("job-states").textContent);

export const JOB_STATES = rendered.states;
export const TERMINAL = new Set(rendered.terminal);
