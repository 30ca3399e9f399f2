// Package promexpr reads the PromQL the chart ships, in its Grafana
// dashboard and its PrometheusRule's alerts, and names the metrics each
// expression uses, with Prometheus's own parser: the tests hold those names
// to what the running binaries export.
package promexpr

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Expr is one PromQL expression and where it was found.
type Expr struct {
	// Where names its panel, variable or alert.
	Where string
	// Query is the expression as written, Grafana variables included.
	Query string
}

// grafanaVariable matches $name, ${name} and ${name:format} (Grafana's
// template variables, $__interval and $__rate_interval included).
var grafanaVariable = regexp.MustCompile(`\$\{[A-Za-z0-9_]+(:[A-Za-z0-9_]+)?\}|\$[A-Za-z0-9_]+`)

// labelValues matches Grafana's label_values(<expr>, <label>) query.
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

// MetricNames parses q and returns the metric names its selectors use,
// sorted. Grafana variables are replaced first: a duration variable by 5m,
// every other by 1 (a number, or the text of a label value).
func MetricNames(q string) ([]string, error) {
	q = grafanaVariable.ReplaceAllStringFunc(q, func(v string) string {
		if strings.Contains(v, "interval") {
			return "5m"
		}
		return "1"
	})
	expr, err := parser.ParseExpr(q)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", q, err)
	}
	var names []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		if name != "" && !slices.Contains(names, name) {
			names = append(names, name)
		}
		return nil
	})
	slices.Sort(names)
	return names, nil
}

// dashboard is what Dashboard reads of a Grafana dashboard.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	// Panels are a collapsed row's.
	Panels []panel `json:"panels"`
}

// Dashboard returns every query of a Grafana dashboard's panels (rows
// included) and of its query variables (the expression inside
// label_values).
func Dashboard(data []byte) ([]Expr, error) {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []Expr
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				if t.Expr != "" {
					out = append(out, Expr{Where: "panel " + p.Title, Query: t.Expr})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// Grafana writes a query variable's query as a string or as
		// {"query": "..."}.
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				return nil, fmt.Errorf("dashboard variable %s: query is neither a string nor an object: %w", v.Name, err)
			}
			q = obj.Query
		}
		if m := labelValues.FindStringSubmatch(q); m != nil {
			q = m[1]
		}
		out = append(out, Expr{Where: "variable " + v.Name, Query: q})
	}
	return out, nil
}

// Rules returns the expression of every rule of a PrometheusRule's spec
// (or a Prometheus rule file): {groups: [{name, rules: [{alert|record, expr}]}]}.
func Rules(data []byte) ([]Expr, error) {
	var spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert  string `json:"alert"`
				Record string `json:"record"`
				Expr   string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	// Rules carry more fields (for, labels, annotations) than read here.
	if err := yaml.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	var out []Expr
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			out = append(out, Expr{Where: "group " + g.Name + ", rule " + r.Alert + r.Record, Query: r.Expr})
		}
	}
	return out, nil
}
