"""A self-contained HTML report of a backtest, for people tuning thresholds.

One section per incident (or per node with findings, before triage runs): the metric the
detectors judged against its baseline band and against its peers (the node's other GPUs), when
each detector fired, and what was decided (commands). Plots are drawn in the browser from data
embedded in the page (inline SVG, no external scripts, works offline). The page sets
``data-rendered`` on ``<body>`` to the number of plots drawn and lists any script error in
``#errors`` (``data-errors``), which the test reads through headless Chromium.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Series:
    name: str
    t: list[float]
    v: list[float | None]
    role: str = "value"  # value | peer | threshold


@dataclass
class Panel:
    title: str
    unit: str = ""
    series: list[Series] = field(default_factory=list)
    band: tuple[list[float], list[float | None], list[float | None]] | None = None  # t, lo, hi
    markers: list[tuple[float, str, str]] = field(default_factory=list)  # t, label, role (finding|command)


@dataclass
class Section:
    heading: str
    summary: str
    panels: list[Panel] = field(default_factory=list)
    findings: list[tuple[float, str, str, str]] = field(default_factory=list)  # ts, detector, severity, summary
    decisions: list[tuple[float, str, str]] = field(default_factory=list)  # ts, action, reason


def downsample(t: list[float], v: list[float | None], limit: int = 600) -> tuple[list[float], list[float | None]]:
    if len(t) <= limit:
        return t, v
    step = len(t) / limit
    idx = [int(i * step) for i in range(limit)]
    return [t[i] for i in idx], [v[i] for i in idx]


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:32px;border-top:1px solid #ccd;padding-top:12px}
.meta{color:#556}table{border-collapse:collapse;margin:8px 0}td,th{padding:2px 8px;border-bottom:1px solid #e4e6eb;
text-align:left;font-size:13px}.sev-critical{color:#b00020}.sev-warning{color:#a15c00}.plot{margin:8px 0}
svg text{font-size:11px;fill:#445}.legend span{margin-right:12px;font-size:12px}#errors{color:#b00020}
"""

_SCRIPT = r"""
(function(){
  var errs=[];
  window.onerror=function(m){errs.push(String(m));report();};
  function report(){var e=document.getElementById('errors');e.textContent=errs.join('\n');
    document.body.setAttribute('data-errors',String(errs.length));}
  var NS='http://www.w3.org/2000/svg';
  function el(n,a){var x=document.createElementNS(NS,n);for(var k in a){x.setAttribute(k,a[k]);}return x;}
  var COL={value:'#1f5fbf',peer:'#9aa3b2',threshold:'#b00020'};
  function draw(host,p){
    var W=1100,H=220,L=60,R=10,T=10,B=28;
    var ts=[],vs=[];
    p.series.forEach(function(s){s.t.forEach(function(t,i){if(s.v[i]!==null){ts.push(t);vs.push(s.v[i]);}});});
    if(p.band){p.band[0].forEach(function(t,i){[p.band[1][i],p.band[2][i]].forEach(function(v){
      if(v!==null){ts.push(t);vs.push(v);}});});}
    if(!ts.length){host.textContent='no data';return;}
    var t0=Math.min.apply(null,ts),t1=Math.max.apply(null,ts),v0=Math.min.apply(null,vs),v1=Math.max.apply(null,vs);
    if(t1===t0){t1=t0+1;} if(v1===v0){v1=v0+1;v0=v0-1;}
    var pad=(v1-v0)*0.08;v0-=pad;v1+=pad;
    function X(t){return L+(t-t0)/(t1-t0)*(W-L-R);} function Y(v){return T+(v1-v)/(v1-v0)*(H-T-B);}
    var svg=el('svg',{width:W,height:H,viewBox:'0 0 '+W+' '+H,role:'img'});
    svg.appendChild(el('rect',{x:L,y:T,width:W-L-R,height:H-T-B,fill:'#fafbfc',stroke:'#dde'}));
    if(p.band){var up='',down='';var bt=p.band[0];
      for(var i=0;i<bt.length;i++){if(p.band[2][i]!==null){up+=(up?'L':'M')+X(bt[i])+','+Y(p.band[2][i]);}}
      for(var j=bt.length-1;j>=0;j--){if(p.band[1][j]!==null){down+='L'+X(bt[j])+','+Y(p.band[1][j]);}}
      if(up){svg.appendChild(el('path',{d:up+down+'Z',fill:'#1f5fbf',opacity:0.12,'class':'band'}));}}
    p.series.forEach(function(s){var d='';
      s.t.forEach(function(t,i){var v=s.v[i];if(v===null){return;}d+=(d?'L':'M')+X(t).toFixed(1)+','+Y(v).toFixed(1);});
      svg.appendChild(el('path',{d:d||'M0,0',fill:'none',stroke:COL[s.role]||'#333',
        'stroke-width':s.role==='value'?1.8:1,'stroke-dasharray':s.role==='threshold'?'4 3':'none',
        'class':'series'}));});
    p.markers.forEach(function(m){var x=X(m[0]);
      svg.appendChild(el('line',{x1:x,x2:x,y1:T,y2:H-B,stroke:m[2]==='command'?'#2e7d32':'#b00020','stroke-width':1}));
      var tx=el('text',{x:x+3,y:T+12});tx.textContent=m[1];svg.appendChild(tx);});
    [v0,(v0+v1)/2,v1].forEach(function(v){var tx=el('text',{x:4,y:Y(v)+4});tx.textContent=v.toPrecision(4);
      svg.appendChild(tx);});
    [t0,t1].forEach(function(t,k){var tx=el('text',{x:k?W-R-120:L,y:H-8});
      tx.textContent=new Date(t*1000).toISOString().slice(0,19).replace('T',' ');svg.appendChild(tx);});
    host.appendChild(svg);
  }
  var data=JSON.parse(document.getElementById('report-data').textContent);var n=0;
  data.forEach(function(p,i){var host=document.getElementById('plot-'+i);if(host){draw(host,p);n++;}});
  document.body.setAttribute('data-rendered',String(n));report();
})();
"""


def render(title: str, meta: dict[str, Any], sections: list[Section]) -> str:
    panels: list[dict[str, Any]] = []
    body: list[str] = [f"<h1>{html.escape(title)}</h1>", '<pre id="errors"></pre>']
    body.append(
        "<p class='meta'>" + " · ".join(f"{html.escape(k)}: {html.escape(str(v))}" for k, v in meta.items()) + "</p>"
    )
    if not sections:
        body.append("<p>No findings.</p>")
    for sec in sections:
        body.append(f"<h2>{html.escape(sec.heading)}</h2><p>{html.escape(sec.summary)}</p>")
        for panel in sec.panels:
            body.append(
                f"<div class='plot'><b>{html.escape(panel.title)}</b> {html.escape(panel.unit)}"
                f"<div class='legend'><span style='color:#1f5fbf'>&#9632; value</span>"
                f"<span style='color:#9aa3b2'>&#9632; peers</span><span>&#9633; baseline band</span>"
                f"<span style='color:#b00020'>| finding</span><span style='color:#2e7d32'>| command</span></div>"
                f"<div id='plot-{len(panels)}'></div></div>"
            )
            panels.append(asdict(panel))
        if sec.findings:
            body.append("<table><tr><th>time (UTC)</th><th>detector</th><th>severity</th><th>finding</th></tr>")
            for ts, det, sev, text in sec.findings[:200]:
                body.append(
                    f"<tr><td>{_time(ts)}</td><td>{html.escape(det)}</td>"
                    f"<td class='sev-{html.escape(sev)}'>{html.escape(sev)}</td><td>{html.escape(text)}</td></tr>"
                )
            body.append("</table>")
        if sec.decisions:
            body.append("<table><tr><th>time (UTC)</th><th>decision</th><th>why</th></tr>")
            for ts, action, reason in sec.decisions[:200]:
                body.append(
                    f"<tr><td>{_time(ts)}</td><td>{html.escape(action)}</td><td>{html.escape(reason)}</td></tr>"
                )
            body.append("</table>")
    data = json.dumps(panels, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body data-rendered='0'>"
        + "".join(body)
        + f"<script id='report-data' type='application/json'>{data}</script><script>{_SCRIPT}</script></body></html>"
    )


def _time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))
