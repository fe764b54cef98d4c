/* Sandman live dashboard.
 *
 * The server embeds every chart's payload ({figure, columns, rows, window}) in
 * #dashboard-data; this script draws them with Plotly (served locally) and keeps them live:
 * a websocket on /ws/dashboard/ pushes {kind, payload} events (see sandman_site/live.py), and
 * each event marks the charts it changes; a marked chart refetches its JSON endpoint and is
 * redrawn with Plotly.react (zoom kept, page never reloaded). Refetches are coalesced: at
 * most one request in flight per chart, and at most one more queued, so a burst of
 * thousands of events costs a handful of requests. A timer refreshes everything once per
 * bucket so the window slides even when nothing happens; after a reconnect everything is
 * refetched because events may have been missed.
 *
 * window.sandmanDashboard exposes counters for tests and curious operators.
 */
(function () {
  "use strict";

  var MIN_GAP_MS = 250; // spacing between two refetches of one chart during a burst

  var dataNode = document.getElementById("dashboard-data");
  if (!dataNode) { return; }
  var payloads = JSON.parse(dataNode.textContent);
  var body = document.body;
  var minutes = body.getAttribute("data-minutes") || "60";
  // The view's filters as a query string (dashboards/filters.py); refetches carry it.
  var query = body.getAttribute("data-query") || ("minutes=" + encodeURIComponent(minutes));
  var bucketS = parseInt(body.getAttribute("data-bucket-s") || "60", 10);
  // Pages other than the overview (/operations/) name their data endpoints here.
  var dataUrl = body.getAttribute("data-data-url") || "/dashboard/data/";
  var statusNode = document.getElementById("live-status");
  var updatedNode = document.getElementById("updated-at");

  var stats = {
    eventsReceived: 0,
    lastEvents: [],
    refreshes: {},
    errors: 0,
    socketOpens: 0,
  };
  window.sandmanDashboard = stats;

  var charts = {};
  Object.keys(payloads).forEach(function (name) {
    charts[name] = { busy: false, again: false, reason: null, timer: null };
    stats.refreshes[name] = { count: 0, lastReason: null };
  });

  var plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function setStatus(text, cls) {
    statusNode.textContent = text;
    statusNode.className = "pill " + (cls || "");
  }

  function fmt(cell) {
    if (cell === null || cell === undefined) { return "–"; }
    if (typeof cell === "number" && !Number.isInteger(cell)) { return cell.toFixed(1); }
    return String(cell);
  }

  function fillTable(name, payload) {
    var tableNode = document.getElementById("table-" + name);
    if (!tableNode) { return; }
    var head = document.createElement("thead");
    var headRow = document.createElement("tr");
    payload.columns.forEach(function (col) {
      var th = document.createElement("th");
      th.textContent = col;
      headRow.appendChild(th);
    });
    head.appendChild(headRow);
    var tbody = document.createElement("tbody");
    payload.rows.forEach(function (row) {
      var tr = document.createElement("tr");
      row.forEach(function (cell) {
        var td = document.createElement("td");
        td.textContent = fmt(cell);
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    if (!payload.rows.length) {
      var tr = document.createElement("tr");
      var td = document.createElement("td");
      td.colSpan = payload.columns.length;
      td.textContent = "no rows in this window";
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
    tableNode.replaceChildren(head, tbody);
  }

  function draw(name, payload) {
    var node = document.getElementById("chart-" + name);
    if (!node) { return Promise.resolve(); }
    payloads[name] = payload;
    fillTable(name, payload);
    return Plotly.react(node, payload.figure.data, payload.figure.layout, plotConfig);
  }

  function refresh(name, reason) {
    var chart = charts[name];
    if (!chart) { return; }
    if (chart.timer) { chart.reason = reason; return; } // a queued refetch will see it
    if (chart.busy) {
      chart.again = true;
      chart.reason = reason;
      return;
    }
    chart.busy = true;
    var url = dataUrl + encodeURIComponent(name) + ".json?" + query;
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error(name + ": HTTP " + response.status); }
        return response.json();
      })
      .then(function (payload) { return draw(name, payload); })
      .then(function () {
        stats.refreshes[name].count += 1;
        stats.refreshes[name].lastReason = reason;
        updatedNode.textContent = new Date().toISOString().slice(11, 19);
      })
      .catch(function (err) {
        stats.errors += 1;
        console.warn("sandman: refresh failed", err);
      })
      .then(function () {
        chart.busy = false;
        if (chart.again) {
          chart.again = false;
          chart.timer = window.setTimeout(function () {
            chart.timer = null;
            refresh(name, chart.reason);
          }, MIN_GAP_MS);
        }
      });
  }

  function refreshAll(reason) {
    Object.keys(charts).forEach(function (name) { refresh(name, reason); });
  }

  // Charts that declare the event kinds they follow (data-refresh-on="kind kind ...").
  function declaredFor(kind) {
    var nodes = document.querySelectorAll(".chart[data-refresh-on]");
    return Array.prototype.filter.call(nodes, function (node) {
      return node.getAttribute("data-refresh-on").split(" ").indexOf(kind) >= 0;
    }).map(function (node) { return node.getAttribute("data-chart"); });
  }

  // Which charts an event changes (kinds and payloads: sandman_site/live.py).
  function chartsFor(kind, payload) {
    payload = payload || {};
    if (kind === "sandbox.state" || kind === "sandbox") {
      var names = ["states"];
      if (payload.state === "requested" || payload.previous === "" || payload.state === undefined) {
        names.push("creates");
      }
      if (payload.state === "ready" || payload.state === undefined) {
        names.push("ready_time", "ready_hist", "ready_split");
      }
      return names;
    }
    if (kind === "acquisition") { return ["acquire_wait", "warm_hits"]; }
    if (kind === "job.state") { return ["warm_hits"]; }
    return [];
  }

  function onEvent(message) {
    stats.eventsReceived += 1;
    stats.lastEvents.push(message);
    if (stats.lastEvents.length > 50) { stats.lastEvents.shift(); }
    var reason = "event:" + message.kind;
    chartsFor(message.kind, message.payload).concat(declaredFor(message.kind))
      .forEach(function (name) { refresh(name, reason); });
  }

  var backoffMs = 1000;
  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + window.location.host + "/ws/dashboard/");
    socket.onopen = function () {
      stats.socketOpens += 1;
      body.setAttribute("data-ws", "open");
      setStatus("live", "ok");
      if (stats.socketOpens > 1) { refreshAll("reconnect"); }
      backoffMs = 1000;
    };
    socket.onmessage = function (msg) {
      var data;
      try { data = JSON.parse(msg.data); } catch (e) { return; }
      if (data && typeof data.kind === "string") { onEvent(data); }
    };
    socket.onclose = function (event) {
      body.setAttribute("data-ws", "closed");
      if (event.code === 4403) {
        setStatus("not authorised for live updates", "bad");
        return;
      }
      setStatus("reconnecting…", "warn");
      window.setTimeout(connect, backoffMs);
      backoffMs = Math.min(backoffMs * 2, 30000);
    };
  }

  var first = Object.keys(payloads).map(function (name) { return draw(name, payloads[name]); });
  Promise.all(first).then(function () { body.setAttribute("data-drawn", "yes"); });
  connect();
  var periodMs = Math.max(15, Math.min(bucketS, 300)) * 1000;
  window.setInterval(function () { refreshAll("timer"); }, periodMs);
})();
