// The memq inspector's progressive enhancement: every page works without it.
// Text is only ever written with textContent, never as markup.
"use strict";

function filterRows(input) {
  const rows = document.querySelectorAll(input.dataset.filterRows);
  const shown = document.getElementById("shown-count");
  const update = () => {
    const wanted = input.value.trim().toLocaleLowerCase();
    let count = 0;
    rows.forEach((row) => {
      const cell = row.querySelector(".fact-content");
      const keep = !cell || !wanted || cell.textContent.toLocaleLowerCase().includes(wanted);
      row.hidden = !keep;
      if (keep && cell) count += 1;
    });
    if (shown) shown.textContent = String(count);
  };
  input.addEventListener("input", update);
}

function mustEqual(input) {
  const button = input.form.querySelector("button[type=submit]");
  const update = () => { button.disabled = input.value !== input.dataset.mustEqual; };
  input.addEventListener("input", update);
  update();
}

function confirmFirst(button) {
  button.addEventListener("click", (event) => {
    if (!window.confirm(button.dataset.confirm)) event.preventDefault();
  });
}

function perMinute(delta, ms) {
  return ms > 0 ? (delta * 60000 / ms).toFixed(1) : "—";
}

function pollQueue(table) {
  let last = {
    extractions: Number(table.dataset.extractions),
    tokens: Number(table.dataset.tokens),
    now: Number(table.dataset.now),
  };
  const dead = Number(table.dataset.dead);
  const live = document.getElementById("live");
  const tick = async () => {
    try {
      const answer = await fetch(table.dataset.poll, { credentials: "same-origin", cache: "no-store" });
      if (!answer.ok) throw new Error(String(answer.status));
      const stats = await answer.json();
      const body = document.createElement("tbody");
      for (const [label, value] of stats.rows) {
        const row = body.insertRow();
        const th = document.createElement("th");
        th.textContent = label;
        row.appendChild(th);
        const td = row.insertCell();
        td.className = "num";
        td.textContent = value;
      }
      table.replaceChild(body, table.tBodies[0]);
      const ms = stats.now_ms - last.now;
      document.getElementById("rate-extractions").textContent =
        perMinute(stats.extractions - last.extractions, ms);
      document.getElementById("rate-tokens").textContent = perMinute(stats.tokens - last.tokens, ms);
      last = { extractions: stats.extractions, tokens: stats.tokens, now: stats.now_ms };
      document.getElementById("dead-changed").hidden = stats.dead === dead;
      live.textContent = "(live, " + new Date().toLocaleTimeString() + ")";
    } catch (error) {
      live.textContent = "(not refreshing: " + error.message + ")";
    }
  };
  window.setInterval(tick, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-filter-rows]").forEach(filterRows);
  document.querySelectorAll("[data-must-equal]").forEach(mustEqual);
  document.querySelectorAll("[data-confirm]").forEach(confirmFirst);
  const stats = document.querySelector("table[data-poll]");
  if (stats) pollQueue(stats);
});
