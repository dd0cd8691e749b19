package sluiceprom_test

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/middleware"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

// The tests of the files in deploy/: they parse as what Prometheus and
// Grafana load, every PromQL expression in them parses, and every metric
// they query is one sluiceprom exports. (Prometheus's own rulefmt would
// bring Kubernetes' client into this module's graph; promql/parser and a
// strict YAML decoding of the same fields do not.)

// ruleGroups is the format of a Prometheus rules file, as rulefmt reads it.
type ruleGroups struct {
	Groups []struct {
		Name        string            `yaml:"name"`
		Interval    string            `yaml:"interval,omitempty"`
		QueryOffset string            `yaml:"query_offset,omitempty"`
		Limit       int               `yaml:"limit,omitempty"`
		Labels      map[string]string `yaml:"labels,omitempty"`
		Rules       []struct {
			Record        string            `yaml:"record,omitempty"`
			Alert         string            `yaml:"alert,omitempty"`
			Expr          string            `yaml:"expr"`
			For           string            `yaml:"for,omitempty"`
			KeepFiringFor string            `yaml:"keep_firing_for,omitempty"`
			Labels        map[string]string `yaml:"labels,omitempty"`
			Annotations   map[string]string `yaml:"annotations,omitempty"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var (
	promql      = parser.NewParser(parser.Options{})
	alertNameRE = regexp.MustCompile(`^[A-Z][A-Za-z]+$`)
)

// metricsOf parses expr and returns the metrics it selects.
func metricsOf(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v\n%s", where, err, expr)
		return nil
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				name = m.Value
			}
		}
		if name == "" {
			t.Errorf("%s: a selector without a metric name: %s", where, vs)
		}
		checkMatchers(t, where, name, vs)
		names = append(names, name)
		return nil
	})
	if len(names) == 0 {
		t.Errorf("%s: no metric in %s", where, expr)
	}
	return names
}

// metricLabels are the labels of each metric, besides the target's job
// and instance.
var metricLabels = map[string][]string{
	sluiceprom.DecisionsTotal:                {"rule", "outcome"},
	sluiceprom.DenyCacheHitsTotal:            {"rule"},
	sluiceprom.StoreServerUp:                 {"server"},
	sluiceprom.StoreServerOutOfMemory:        {"server"},
	sluiceprom.StoreServerMayEvict:           {"server"},
	sluiceprom.StoreServerEvictedKeys:        {"server"},
	sluiceprom.RulesReloadsTotal:             {"result"},
	sluiceprom.StoreCallDuration + "_bucket": {"le"},
	sluiceprom.StoreBatchSize + "_bucket":    {"le"},
}

// labelValues are the values of the labels that have a fixed set.
var labelValues = map[string][]string{
	"outcome": outcomeNames(),
	"result":  {"ok", "error"},
}

func outcomeNames() []string {
	var names []string
	for o := middleware.Outcome(1); o.String() != "unknown"; o++ {
		names = append(names, o.String())
	}
	return names
}

// checkMatchers fails unless the label matchers of vs name labels that the
// metric has, with values it can take.
func checkMatchers(t *testing.T, where, metric string, vs *parser.VectorSelector) {
	t.Helper()
	for _, m := range vs.LabelMatchers {
		switch m.Name {
		case model.MetricNameLabel, "job", "instance":
			continue
		}
		if !slices.Contains(metricLabels[metric], m.Name) {
			t.Errorf("%s: %s has no label %s", where, metric, m.Name)
			continue
		}
		values, fixed := labelValues[m.Name]
		if !fixed {
			continue
		}
		for _, v := range strings.Split(m.Value, "|") {
			if (m.Type == labels.MatchEqual || m.Type == labels.MatchRegexp) && !slices.Contains(values, v) {
				t.Errorf("%s: %s{%s} is never %q (it is one of %v)", where, metric, m.Name, v, values)
			}
		}
	}
}

// checkExported fails unless name is a metric sluiceprom exports, or a
// series of one of its histograms.
func checkExported(t *testing.T, where, name string) {
	t.Helper()
	if slices.Contains(sluiceprom.MetricNames, name) {
		return
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && (base == sluiceprom.StoreCallDuration || base == sluiceprom.StoreBatchSize || base == sluiceprom.SyncFlushDuration || base == sluiceprom.RegionPeerLag || base == sluiceprom.OutboundWaitSeconds || base == sluiceprom.UsageDebt) {
			return
		}
	}
	t.Errorf("%s: %s is not a metric sluiceprom exports (MetricNames)", where, name)
}

// checkTemplate parses and runs text as Prometheus expands an alert's
// annotations, with the variables Prometheus defines.
func checkTemplate(t *testing.T, where, text string) {
	t.Helper()
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"
	tmpl, err := template.New(where).Funcs(templateFuncs).Option("missingkey=zero").Parse(defs + text)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	data := struct {
		Labels, ExternalLabels map[string]string
		ExternalURL            string
		Value                  float64
	}{Labels: map[string]string{"job": "api", "rule": "login"}, Value: 0.5}
	if err := tmpl.Execute(io.Discard, data); err != nil {
		t.Errorf("%s: %v", where, err)
	}
}

// templateFuncs stand in for the functions of Prometheus's alert templates
// that the annotations use, so that their syntax can be checked.
var templateFuncs = template.FuncMap{
	"humanize":           func(v float64) string { return "" },
	"humanizePercentage": func(v float64) string { return "" },
	"humanizeDuration":   func(v float64) string { return "" },
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("deploy/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rg ruleGroups
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rg); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	if len(rg.Groups) == 0 {
		t.Fatal("alerts.yml: no groups")
	}
	alerts := map[string]bool{}
	for _, g := range rg.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: want a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			where := "alert " + r.Alert
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("%s record %q: want exactly one of alert and record", where, r.Record)
			}
			if r.Record != "" {
				t.Errorf("record %s: the rules file has alerts only; a recording rule's name would have to be a sluiceprom metric", r.Record)
			}
			if alerts[r.Alert] {
				t.Errorf("%s: twice", where)
			}
			alerts[r.Alert] = true
			if !alertNameRE.MatchString(r.Alert) {
				t.Errorf("%s: want a CamelCase name", where)
			}
			for _, d := range []string{r.For, r.KeepFiringFor} {
				if _, err := model.ParseDuration(d); d != "" && err != nil {
					t.Errorf("%s: %v", where, err)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a severity label and summary and description annotations", where)
			}
			for k, v := range r.Annotations {
				checkTemplate(t, where+": annotation "+k, v)
			}
			for _, name := range metricsOf(t, where, r.Expr) {
				checkExported(t, where, name)
			}
		}
	}
	// The alerts the deploy files promise.
	for _, a := range []string{"SluiceDenialSpike", "SluiceDenialRateHigh", "SluiceFailingOpen"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
}

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

// grafanaVars are the values the test gives the dashboard's variables.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__interval", "15s",
	"$__range", "1h",
	"$job", ".*",
	"$rule", ".*",
)

var labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_]\w*)\)$`)

func TestDashboard(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("deploy/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if d.Title == "" || d.UID == "" {
		t.Error("dashboard.json: want a title and a uid")
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)["query"].(string)
		m := labelValuesRE.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: want label_values(selector, label), got %q", v.Name, q)
			continue
		}
		for _, name := range metricsOf(t, "variable "+v.Name, grafanaVars.Replace(m[1])) {
			checkExported(t, "variable "+v.Name, name)
		}
	}

	// Every metric the brief's panels need is queried somewhere.
	queried := map[string]bool{}
	ids := map[int]bool{}
	var panels []panel
	for _, p := range d.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...)
	}
	for _, p := range panels {
		where := "panel " + p.Title
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("%s: id %d missing or used twice", where, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: bad gridPos %+v", where, p.GridPos)
		}
		for _, q := range panels {
			a, b := p.GridPos, q.GridPos
			if q.ID < p.ID && a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("%s overlaps panel %s", where, q.Title)
			}
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", where)
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" {
				t.Errorf("%s: a query without refId", where)
			}
			for _, name := range metricsOf(t, where, grafanaVars.Replace(tg.Expr)) {
				checkExported(t, where, name)
				queried[strings.TrimSuffix(name, "_bucket")] = true
			}
		}
	}
	for _, name := range sluiceprom.MetricNames {
		if !queried[name] && !queried[name+"_count"] {
			t.Errorf("no panel shows %s", name)
		}
	}
}
