// Draws the timeline from the JSON block as SVG: one row per lane, one
// rectangle per bar, an idle hatch from each lane's last bar to the end.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("timeline-data").textContent);
  var chart = document.getElementById("chart");
  var NS = "http://www.w3.org/2000/svg";
  var ROW = 24, BAR = 18, LABEL = 170, TOP = 22, RIGHT = 12;

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function human(ms) {
    if (ms < 1000) return ms + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(2) + " s";
    return Math.floor(ms / 60000) + " min " + String(Math.floor((ms % 60000) / 1000)).padStart(2, "0") + " s";
  }
  function step(span, px) {
    var raw = span / Math.max(1, px / 90), unit = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1))));
    var choices = [1, 2, 5, 10];
    for (var i = 0; i < choices.length; i++) if (unit * choices[i] >= raw) return unit * choices[i];
    return unit * 10;
  }

  function draw() {
    chart.textContent = "";
    var width = Math.max(480, chart.clientWidth);
    var plot = width - LABEL - RIGHT;
    var span = Math.max(1, data.span_ms);
    var x = function (ms) { return LABEL + (ms / span) * plot; };
    var height = TOP + data.lanes.length * ROW + 4;
    var svg = el("svg", { width: width, height: height, "shape-rendering": "crispEdges" }, chart);
    var defs = el("defs", {}, svg);
    var hatch = el("pattern", { id: "idle", width: 6, height: 6, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(45)" }, defs);
    el("rect", { width: 6, height: 6, fill: "#f2f2f2" }, hatch);
    el("rect", { width: 2, height: 6, fill: "#bdbdbd" }, hatch);

    var every = step(span, plot);
    for (var t = 0; t <= span; t += every) {
      el("line", { class: "grid", x1: x(t), x2: x(t), y1: TOP - 4, y2: height }, svg);
      el("text", { class: "tick", x: x(t) + 2, y: 12 }, svg).textContent = human(t);
    }
    data.lanes.forEach(function (lane, i) {
      var y = TOP + i * ROW;
      var label = el("text", { class: "lane-label", x: 4, y: y + BAR - 4 }, svg);
      label.textContent = lane.worker + " #" + lane.slot;
      if (lane.idle_at_end_ms > 0) {
        var idle = el("rect", { class: "idle", x: x(lane.last_end_ms), y: y, height: BAR,
          width: Math.max(1, x(span) - x(lane.last_end_ms)), fill: "url(#idle)" }, svg);
        el("title", {}, idle).textContent = lane.worker + " #" + lane.slot + ": idle for the last " +
          human(lane.idle_at_end_ms);
      }
    });
    data.bars.forEach(function (bar) {
      var kind = data.kinds[bar[3]];
      var y = TOP + bar[0] * ROW;
      // A pixel of white between neighbours keeps units in a row apart; what
      // went wrong is drawn at least 4 px wide so a short test is not lost.
      var least = kind.name === "passed" || kind.name === "overhead" || kind.name === "skipped" ? 1 : 4;
      var rect = el("rect", { class: "bar " + kind.name, x: x(bar[1]), y: y, height: BAR,
        width: Math.max(least, x(bar[2]) - x(bar[1]) - 1), fill: kind.colour, "data-unit": bar[4] }, svg);
      var what = bar[4] ? bar[4] + " (attempt " + bar[5] + ")" : "batch overhead";
      el("title", {}, rect).textContent = what + ": " + kind.name + ", " + human(bar[2] - bar[1]) +
        (bar[6] ? "\n" + bar[6] : "");
    });
    svg.addEventListener("click", function (event) {
      var unit = event.target.getAttribute && event.target.getAttribute("data-unit");
      var bars = svg.querySelectorAll(".bar");
      for (var i = 0; i < bars.length; i++) {
        var same = !unit || bars[i].getAttribute("data-unit") === unit;
        bars[i].classList.toggle("dim", !same);
      }
    });
  }
  draw();
  var pending;
  window.addEventListener("resize", function () { clearTimeout(pending); pending = setTimeout(draw, 100); });
})();
