"""A self-contained HTML report of a backtest, for people tuning thresholds.

The page opens with an overview (the span and counts, the score against a simulation's truth when
there is one, and the incidents, each linking to its section), then one section per incident (and
per node whose findings made no incident): the metric the detectors judged against its baseline
band and against its peers (the node's other GPUs), when each detector fired, and what fleetmedic
would do. Plots are drawn in the browser by one script from data embedded once in the page (inline
SVG, no external scripts, works offline).

Size: every series is cut into as many time buckets as the plot has pixel columns / 2 (min and
max per bucket for the judged value, so a one-sample spike still shows) and quantised to 4096
levels of the plot's range, two characters a value; the markers of a section are stored once for
all its plots. 16 nodes x 3 h with every fault kind and heavy noise (540 findings, 28 incidents)
make a page of about 0.23 MB (2.83 MB with every sample written out).

For tests: the page sets ``data-rendered`` on ``<body>`` to the number of plots drawn, lists any
script error in ``#errors`` (``data-errors``), and records where the overview ends
(``data-overview-bottom``) against the window's height (``data-viewport-height``), as laid out
by the browser.
"""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

#: plot geometry (CSS pixels): the data is cut to the plot area's width
PLOT_W, PLOT_H, PLOT_LEFT, PLOT_RIGHT = 1100, 230, 78, 12
BUCKETS = (PLOT_W - PLOT_LEFT - PLOT_RIGHT) // 2
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_LEVELS = len(_ALPHABET) ** 2 - 1  # 4095 steps; "~~" is a gap


@dataclass
class Plot:
    """One plot: bucketed arrays (``None`` where a bucket has no sample) over ``[t0, t1]``.

    ``arrays`` keys: ``v_lo``/``v_hi`` (the judged value's min and max per bucket), ``p_lo``/
    ``p_hi``/``p_med`` (its peers' envelope and median), ``b_lo``/``b_hi`` (the baseline band)."""

    title: str
    unit: str
    arrays: dict[str, list[float | None]]
    threshold: float | None = None
    anchor: str = ""  # the section whose markers it shows


@dataclass
class Row:
    cells: list[str]
    css: str = ""


@dataclass
class Section:
    anchor: str
    heading: str
    summary: str
    plots: list[Plot] = field(default_factory=list)
    plot_refs: list[tuple[str, str]] = field(default_factory=list)  # (title, anchor): shown in another section
    findings: list[Row] = field(default_factory=list)
    actions: list[Row] = field(default_factory=list)
    actions_note: str = ""
    markers: list[tuple[float, str, str]] = field(default_factory=list)  # t, label, role (finding | command)


@dataclass
class Overview:
    facts: list[tuple[str, str]]  # label, value
    score: dict[str, Any] | None
    incidents: list[Row]  # first cell: the anchor, second the link text
    quiet: list[tuple[str, str]]  # (anchor, text) of the sections without an incident


def bucket(t: list[float], v: list[float | None], t0: float, t1: float, how: str,
           n: int = BUCKETS) -> list[float | None]:
    """``v`` (sampled at ``t``) cut into ``n`` equal buckets over ``[t0, t1]``: each bucket's min,
    max or mean (``how``), ``None`` where it has no value."""
    acc: list[list[float]] = [[] for _ in range(n)]
    span = max(t1 - t0, 1e-9)
    for ts, x in zip(t, v, strict=True):
        if x is None or not math.isfinite(x):
            continue
        k = min(n - 1, max(0, int((ts - t0) / span * n)))
        acc[k].append(x)
    if how == "min":
        return [min(xs) if xs else None for xs in acc]
    if how == "max":
        return [max(xs) if xs else None for xs in acc]
    return [sum(xs) / len(xs) if xs else None for xs in acc]


def _encode(values: list[float | None], lo: float, q: float) -> str:
    out = []
    for x in values:
        if x is None:
            out.append("~~")
        else:
            k = min(_LEVELS, max(0, round((x - lo) / q)))
            out.append(_ALPHABET[k >> 6] + _ALPHABET[k & 63])
    return "".join(out)


def _plot_data(plot: Plot, t0: float, t1: float) -> dict[str, Any]:
    finite = [x for arr in plot.arrays.values() for x in arr if x is not None]
    if plot.threshold is not None:
        finite.append(plot.threshold)
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    q = (hi - lo) / _LEVELS or 1.0
    return {"title": plot.title, "unit": plot.unit, "sec": plot.anchor, "t0": round(t0), "t1": round(t1),
            "lo": _sig(lo), "q": _sig(q), "thr": plot.threshold,
            "a": {k: _encode(v, _sig(lo), _sig(q)) for k, v in plot.arrays.items()}}


def _sig(x: float) -> float:
    """``x`` to 6 significant digits (what the encoding and the axis labels need)."""
    return float(f"{x:.6g}")


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#1d2330;max-width:1180px}
h1{font-size:21px;margin:0 0 4px}h2{font-size:17px;margin-top:28px;border-top:1px solid #ccd;padding-top:10px}
h3{font-size:14px;margin:14px 0 4px}
a{color:#1f5fbf}.meta{color:#556;margin:2px 0}table{border-collapse:collapse;margin:6px 0}
td,th{padding:1px 8px;border-bottom:1px solid #e4e6eb;text-align:left;font-size:13px;vertical-align:top;
white-space:nowrap}td:last-child{white-space:normal}
.sev-critical{color:#b00020}.sev-warning{color:#a15c00}.plot{margin:10px 0}.note{color:#556;font-size:13px}
svg text{font-size:11px;fill:#445}.legend span{margin-right:14px;font-size:12px}#errors{color:#b00020;margin:0}
#overview{border:1px solid #dde;background:#fafbfc;padding:8px 12px;border-radius:4px}
.facts{margin:2px 0 6px}.facts span{margin-right:18px;display:inline-block}.score b{font-size:15px}
.incidents{max-height:42vh;overflow:auto}.incidents table{table-layout:fixed;width:100%;margin:0}
.incidents td,.incidents th{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
"""

_SCRIPT = r"""
(function(){
  var errs=[];
  window.onerror=function(m){errs.push(String(m));report();};
  function report(){var e=document.getElementById('errors');e.textContent=errs.join('\n');
    document.body.setAttribute('data-errors',String(errs.length));}
  var NS='http://www.w3.org/2000/svg',A='ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
  var IDX={};for(var c=0;c<A.length;c++){IDX[A.charAt(c)]=c;}
  function el(n,a){var x=document.createElementNS(NS,n);for(var k in a){x.setAttribute(k,a[k]);}return x;}
  function txt(x,y,s,anchor){var t=el('text',{x:x,y:y,'text-anchor':anchor||'start'});t.textContent=s;return t;}
  function decode(s,lo,q){var out=[];for(var i=0;i<s.length;i+=2){var a=s.charAt(i);
    out.push(a==='~'?null:lo+(IDX[a]*64+IDX[s.charAt(i+1)])*q);}return out;}
  function niceStep(span,n){var raw=span/n,p=Math.pow(10,Math.floor(Math.log10(raw))),m=raw/p;
    return (m<=1?1:m<=2?2:m<=2.5?2.5:m<=5?5:10)*p;}
  var TSTEPS=[60,120,300,600,900,1800,3600,7200,10800,21600,43200,86400,172800,604800];
  function pad(x){return (x<10?'0':'')+x;}
  function tlabel(t,withDay){var d=new Date(t*1000),hm=pad(d.getUTCHours())+':'+pad(d.getUTCMinutes());
    return withDay?(d.getUTCFullYear()+'-'+pad(d.getUTCMonth()+1)+'-'+pad(d.getUTCDate())+' '+hm):hm;}
  var data=JSON.parse(document.getElementById('report-data').textContent);
  var W=data.geom[0],H=data.geom[1],L=data.geom[2],R=data.geom[3],T=8,B=34;
  function draw(host,p,markers,labels){
    var arr={};for(var k in p.a){arr[k]=decode(p.a[k],p.lo,p.q);}
    var n=(arr.v_lo||arr.v_hi||[]).length,t0=p.t0,t1=p.t1>p.t0?p.t1:p.t0+1;
    var vs=[];for(var k2 in arr){arr[k2].forEach(function(v){if(v!==null){vs.push(v);}});}
    if(p.thr!==null){vs.push(p.thr);}
    if(!vs.length||!n){host.appendChild(document.createTextNode('no data'));return;}
    var v0=Math.min.apply(null,vs),v1=Math.max.apply(null,vs);if(v1===v0){v1=v0+1;v0=v0-1;}
    var ys=niceStep(v1-v0,5);v0=Math.floor(v0/ys)*ys;v1=Math.ceil(v1/ys)*ys;
    var dec=Math.max(0,-Math.floor(Math.log10(ys)+1e-9));if(ys*Math.pow(10,dec)%1>1e-6){dec+=1;}
    function X(t){return L+(t-t0)/(t1-t0)*(W-L-R);} function Y(v){return T+(v1-v)/(v1-v0)*(H-T-B);}
    function XB(i){return L+(i+0.5)/n*(W-L-R);}
    var svg=el('svg',{width:W,height:H,viewBox:'0 0 '+W+' '+H,role:'img'});
    svg.appendChild(el('rect',{x:L,y:T,width:W-L-R,height:H-T-B,fill:'#fafbfc',stroke:'#dde'}));
    host.appendChild(svg);
    for(var yv=v0;yv<=v1+ys/2;yv+=ys){var y=Y(yv);
      svg.appendChild(el('line',{x1:L,x2:W-R,y1:y,y2:y,stroke:'#e8eaef'}));
      svg.appendChild(txt(L-4,y+4,(Math.abs(yv)<ys/2?0:yv).toFixed(dec),'end'));}
    var yt=txt(0,0,p.unit,'middle');yt.setAttribute('transform','translate(12,'+((H-B+T)/2)+') rotate(-90)');
    svg.appendChild(yt);
    var step=TSTEPS[TSTEPS.length-1];for(var s=0;s<TSTEPS.length;s++){if((t1-t0)/TSTEPS[s]<=9){step=TSTEPS[s];break;}}
    var first=true,lastDay=null;
    for(var tt=Math.ceil(t0/step)*step;tt<=t1;tt+=step){var x=X(tt),day=Math.floor(tt/86400);
      svg.appendChild(el('line',{x1:x,x2:x,y1:T,y2:H-B,stroke:'#eef0f3'}));
      svg.appendChild(el('line',{x1:x,x2:x,y1:H-B,y2:H-B+4,stroke:'#99a'}));
      var lab=tlabel(tt,first||day!==lastDay),half=lab.length*3.2;
      svg.appendChild(txt(x,H-B+16,lab,x-half<2?'start':x+half>W-2?'end':'middle'));first=false;lastDay=day;}
    svg.appendChild(txt(W-R,H-1,'time (UTC)','end'));
    function band(lo,hi,fill,op,cls){var up='',down='';
      for(var i=0;i<n;i++){if(lo[i]!==null&&hi[i]!==null){up+=(up?'L':'M')+XB(i).toFixed(1)+','+Y(hi[i]).toFixed(1);}}
      for(var j=n-1;j>=0;j--){if(lo[j]!==null&&hi[j]!==null){down+='L'+XB(j).toFixed(1)+','+Y(lo[j]).toFixed(1);}}
      if(up){svg.appendChild(el('path',{d:up+down+'Z',fill:fill,opacity:op,'class':cls}));}}
    function line(a,b,col,w,cls){var d='',prev=null,gap=0;  // bridges up to 3 empty buckets (sparser samples)
      for(var i=0;i<n;i++){var lo=a[i],hi=b?b[i]:a[i];if(lo===null||hi===null){if(++gap>3){prev=null;}continue;}
        gap=0;
        var x=XB(i).toFixed(1),ya=Y(lo),yb=Y(hi);
        if(prev!==null&&Math.abs(prev-yb)<Math.abs(prev-ya)){var sw=ya;ya=yb;yb=sw;}
        d+=(prev===null?'M':'L')+x+','+ya.toFixed(1)+(ya!==yb?'L'+x+','+yb.toFixed(1):'');prev=yb;}
      if(d){svg.appendChild(el('path',{d:d,fill:'none',stroke:col,'stroke-width':w,'class':cls}));}}
    if(arr.p_lo&&arr.p_hi){band(arr.p_lo,arr.p_hi,'#9aa3b2',0.25,'peers');}
    if(arr.b_lo&&arr.b_hi){band(arr.b_lo,arr.b_hi,'#1f5fbf',0.13,'band');}
    if(arr.p_med){line(arr.p_med,null,'#7d8696',1,'series peer');}
    if(p.thr!==null){svg.appendChild(el('line',{x1:L,x2:W-R,y1:Y(p.thr),y2:Y(p.thr),stroke:'#b00020',
      'stroke-dasharray':'5 3','class':'series threshold'}));}
    if(arr.v_lo){line(arr.v_lo,arr.v_hi,'#1f5fbf',1.6,'series value');}
    var rows=[],total={},named={};
    (markers||[]).forEach(function(m){total[m[1]]=(total[m[1]]||0)+m[3];});
    (markers||[]).forEach(function(m){var x=X(p.t0+m[0]);if(x<L||x>W-R){return;}
      var cmd=m[2]===1,col=cmd?'#2e7d32':'#b00020';
      svg.appendChild(el('line',{x1:x,x2:x,y1:T,y2:H-B,stroke:col,'stroke-width':1,opacity:0.8,'class':'marker'}));
      if(named[m[1]]){return;}  // each label once, where it first fired, with its count
      named[m[1]]=1;
      var label=labels[m[1]]+(total[m[1]]>1?' \u00d7'+total[m[1]]:''),t=txt(0,0,label);
      t.setAttribute('fill',col);t.setAttribute('class','mlabel');svg.appendChild(t);
      var wid=Math.ceil(t.getComputedTextLength())+4,left=x+3;  // measured by the browser
      if(left+wid>W-R){left=x-3-wid;}
      var row=0;while(row<rows.length&&rows[row]>left){row++;}
      if(row>=5){svg.removeChild(t);return;}  // no room: the line stays, the label is in the tables
      rows[row]=left+wid;
      t.setAttribute('x',left);t.setAttribute('y',T+11+row*13);t.setAttribute('data-w',wid);
      svg.insertBefore(el('rect',{x:left-1,y:T+2+row*13,width:wid,height:12,fill:'#fff',opacity:0.85}),t);});
  }
  var n=0;
  data.plots.forEach(function(p,i){var host=document.getElementById('plot-'+i);
    if(host){draw(host,p,data.markers[p.sec],data.labels);n++;}});
  document.body.setAttribute('data-rendered',String(n));
  var ov=document.getElementById('overview');
  if(ov){document.body.setAttribute('data-overview-bottom',String(Math.ceil(ov.getBoundingClientRect().bottom)));
    document.body.setAttribute('data-viewport-height',String(window.innerHeight));}
  report();
})();
"""


def render(title: str, overview: Overview, sections: list[Section], t0: float, t1: float) -> str:
    """The page: the overview, then the sections; plots over ``[t0, t1]``."""
    e = html.escape
    body: list[str] = [f"<h1>{e(title)}</h1>", '<pre id="errors"></pre>', "<div id='overview'>"]
    body.append("<p class='facts'>" + "".join(f"<span>{e(k)}: <b>{e(v)}</b></span>" for k, v in overview.facts)
                + "</p>")
    if overview.score:
        s = overview.score
        delay = s.get("delay_p50_s")
        items = [("precision", _pct(s.get("precision"))), ("recall", _pct(s.get("recall"))),
                 ("F1", _pct(s.get("f1"))), ("top-1 class", _pct(s.get("top1"))),
                 ("false incidents", str(s.get("false_incidents", "?"))),
                 ("detection delay p50", "n/a" if delay is None else f"{float(delay):.0f} s")]
        body.append("<p class='facts score'>Score against the truth: "
                    + "".join(f"<span>{e(k)} <b>{e(v)}</b></span>" for k, v in items) + "</p>")
    if overview.incidents:
        body.append(f"<div class='incidents'><table><colgroup><col style='width:3%'><col style='width:27%'>"
                    "<col style='width:9%'><col style='width:22%'><col style='width:6%'><col style='width:33%'>"
                    f"</colgroup><tr><th>#</th><th>incident ({len(overview.incidents)})</th><th>first seen</th>"
                    "<th>suspects</th><th>conf.</th><th>would do</th></tr>")
        for k, row in enumerate(overview.incidents, 1):
            anchor, text, *rest = row.cells
            cells = "".join(f"<td title='{e(c)}'>{e(c)}</td>" for c in rest)
            body.append(f"<tr><td>{k}</td><td title='{e(text)}'><a href='#{e(anchor)}'>{e(text)}</a></td>{cells}</tr>")
        body.append("</table></div>")
    else:
        body.append("<p>No incident.</p>")
    if overview.quiet:
        body.append("<p class='meta'>Findings without an incident on: "
                    + ", ".join(f"<a href='#{e(a)}'>{e(t)}</a>" for a, t in overview.quiet) + "</p>")
    body.append("</div>")
    plots: list[dict[str, Any]] = []
    labels: dict[str, int] = {}
    markers: dict[str, list[list[int]]] = {}
    for sec in sections:
        body.append(f"<h2 id='{e(sec.anchor)}'>{e(sec.heading)}</h2><p>{e(sec.summary)}</p>")
        markers[sec.anchor] = [[round(ts - t0), labels.setdefault(label, len(labels)), int(role == "command"), k]
                               for ts, label, role, k in _merge(sec.markers, (t1 - t0) / BUCKETS * 4)]
        for plot in sec.plots:
            body.append(f"<div class='plot'><b>{e(plot.title)}</b>{_legend(plot)}<div id='plot-{len(plots)}'></div>"
                        "</div>")
            plots.append(_plot_data(plot, t0, t1))
        for ptitle, anchor in sec.plot_refs:
            body.append(f"<p class='note'>{e(ptitle)}: plotted in <a href='#{e(anchor)}'>"
                        f"{e(anchor.replace('-', ' ', 1))}</a>.</p>")
        if sec.findings:
            body.append("<h3>Findings</h3><table><tr><th>first (UTC)</th><th>last</th><th>count</th><th>detector</th>"
                        "<th>severity</th><th>finding (the first)</th></tr>")
            for row in sec.findings:
                body.append("<tr>" + "".join(
                    f"<td class='sev-{e(c)}'>{e(c)}</td>" if i == 4 else f"<td>{e(c)}</td>"
                    for i, c in enumerate(row.cells)) + "</tr>")
            body.append("</table>")
        if sec.actions:
            body.append("<h3>What fleetmedic would do</h3><table><tr><th>first (UTC)</th><th>would</th>"
                        "<th>target</th><th>issued</th><th>why</th></tr>")
            for row in sec.actions:
                body.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row.cells) + "</tr>")
            body.append("</table>")
        if sec.actions_note:
            body.append(f"<p class='note'>{e(sec.actions_note)}</p>")
    if not sections:
        body.append("<p>No findings.</p>")
    data = json.dumps({"geom": [PLOT_W, PLOT_H, PLOT_LEFT, PLOT_RIGHT], "plots": plots, "markers": markers,
                       "labels": list(labels)}, separators=(",", ":"),
                      allow_nan=False).replace("</", "<\\/")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width'>"
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body data-rendered='0'>"
        + "".join(body)
        + f"<script id='report-data' type='application/json'>{data}</script><script>{_SCRIPT}</script></body></html>"
    )


def _legend(plot: Plot) -> str:
    keys = [("v_lo", "#1f5fbf", "the GPU (min-max per pixel)" if "b_lo" in plot.arrays else
             "increase per sample (min-max per pixel)"), ("p_med", "#7d8696", "its peers: median, range"),
            ("b_lo", "#8fb0e6", "its baseline band")]
    items = [f"<span style='color:{c}'>&#9632; {t}</span>" for k, c, t in keys if k in plot.arrays]
    if plot.threshold is not None:
        items.append(f"<span style='color:#b00020'>- - threshold {plot.threshold:g}</span>")
    items += ["<span style='color:#b00020'>| finding</span>", "<span style='color:#2e7d32'>| would act</span>"]
    return "<div class='legend'>" + "".join(items) + "</div>"


def _merge(markers: list[tuple[float, str, str]], window: float) -> list[tuple[float, str, str, int]]:
    """Markers of one label closer than ``window`` seconds become one, with their count."""
    out: list[tuple[float, str, str, int]] = []
    last: dict[tuple[str, str], int] = {}
    for ts, label, role in sorted(markers):
        k = last.get((label, role))
        if k is not None and ts - out[k][0] <= window:
            out[k] = (out[k][0], label, role, out[k][3] + 1)
            continue
        last[(label, role)] = len(out)
        out.append((ts, label, role, 1))
    return out


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * float(x):.0f} %"


def utc(ts: float, seconds: bool = True) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", time.gmtime(ts))
