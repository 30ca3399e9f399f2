package testbed

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape scrapes http://addr/metrics, as Prometheus would, and returns
// its metric families by name.
func Scrape(addr string) (map[string]*dto.MetricFamily, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse metrics of %s: %w", addr, err)
	}
	return families, nil
}

// ErrNoSeries is Metric's error when the endpoint has no such series: a
// labelled counter appears only once it was first counted.
var ErrNoSeries = errors.New("no such series")

// Metric scrapes http://addr/metrics, as Prometheus would, and returns the
// value of the series name with exactly the given labels: a counter's or
// gauge's value, or a histogram's sample count.
func Metric(addr, name string, labels map[string]string) (float64, error) {
	families, err := Scrape(addr)
	if err != nil {
		return 0, err
	}
	family, ok := families[name]
	if !ok {
		return 0, fmt.Errorf("%w: no metric %s at %s", ErrNoSeries, name, addr)
	}
	for _, m := range family.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		if !maps.Equal(have, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), nil
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), nil
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), nil
		}
	}
	return 0, fmt.Errorf("%w: %s%v at %s", ErrNoSeries, name, labels, addr)
}
