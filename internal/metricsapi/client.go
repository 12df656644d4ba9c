package metricsapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync"
)

// API is what the client needs from the platform: one authenticated,
// retried JSON call relative to the metrics service (/metrics/v1).
// *platform.Service provides it.
type API interface {
	Do(ctx context.Context, method, path string, query url.Values, in, out any) error
}

// DefaultConcurrency is how many data requests of one query run at once.
const DefaultConcurrency = 2

// Client is the typed Metrics API client. It is safe for concurrent use.
type Client struct {
	api         API
	concurrency int

	mu       sync.Mutex
	datasets map[string]*Dataset // descriptors seen, by name
}

// NewClient returns a client calling api, typically platform.Client.Metrics().
func NewClient(api API) *Client {
	return &Client{api: api, concurrency: DefaultConcurrency, datasets: map[string]*Dataset{}}
}

// Datasets lists every dataset's descriptor (GET /datasets).
func (c *Client) Datasets(ctx context.Context) ([]Dataset, error) {
	var resp struct {
		Items []Dataset `json:"items"`
	}
	if err := c.api.Do(ctx, http.MethodGet, "/datasets", nil, nil, &resp); err != nil {
		return nil, fmt.Errorf("list datasets: %w", err)
	}
	c.mu.Lock()
	for i := range resp.Items {
		d := resp.Items[i]
		c.datasets[d.Name] = &d
	}
	c.mu.Unlock()
	return resp.Items, nil
}

// Dataset gets one dataset's descriptor (GET /datasets/{name}).
func (c *Client) Dataset(ctx context.Context, name string) (*Dataset, error) {
	var d Dataset
	if err := c.api.Do(ctx, http.MethodGet, "/datasets/"+url.PathEscape(name), nil, nil, &d); err != nil {
		return nil, fmt.Errorf("dataset %s: %w", name, err)
	}
	if d.Name == "" {
		d.Name = name
	}
	c.mu.Lock()
	cp := d
	c.datasets[name] = &cp
	c.mu.Unlock()
	return &d, nil
}

// descriptor returns the dataset's descriptor, fetching it when not seen yet.
func (c *Client) descriptor(ctx context.Context, name string) (*Dataset, error) {
	c.mu.Lock()
	d, ok := c.datasets[name]
	c.mu.Unlock()
	if ok {
		return d, nil
	}
	return c.Dataset(ctx, name)
}

// Data answers q: it plans the requests the API's limits require (see Plan),
// runs them with bounded concurrency and merges their rows. Nil q.Labels or
// q.Metrics ask for all of the dataset's, read from its descriptor (fetched
// once and cached). When the descriptor is known, the granularity, labels and
// metrics are checked against it before any data request is sent. Rows come in
// no particular order. An error from any request fails the whole query.
func (c *Client) Data(ctx context.Context, q Query) (*Result, error) {
	if q.Labels == nil || q.Metrics == nil {
		d, err := c.descriptor(ctx, q.Dataset)
		if err != nil {
			return nil, fmt.Errorf("query %s: %w", q.Dataset, err)
		}
		if q.Labels == nil {
			for _, l := range d.Labels() {
				q.Labels = append(q.Labels, l.Name)
			}
			if q.Labels == nil {
				q.Labels = []string{}
			}
		}
		if q.Metrics == nil {
			q.Metrics = d.MetricNames()
		}
	}
	c.mu.Lock()
	d := c.datasets[q.Dataset]
	c.mu.Unlock()
	if d != nil {
		if err := check(d, q); err != nil {
			return nil, err
		}
	}
	reqs, err := Plan(q)
	if err != nil {
		return nil, err
	}
	res := &Result{Labels: planLabels(q.Labels), Metrics: dedupe(q.Metrics)}
	if len(reqs) == 0 {
		return res, nil
	}
	parts := make([][]Row, len(reqs))
	probs := make([]Problems, len(reqs))
	if err := c.runAll(ctx, reqs, parts, probs); err != nil {
		return nil, err
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	res.Rows = make([]Row, 0, n)
	for i, p := range parts {
		res.Rows = append(res.Rows, p...)
		res.Problems.Add(probs[i])
	}
	res.Requests = len(reqs)
	return res, nil
}

// planLabels is the label list Plan derives from q.Labels.
func planLabels(labels []string) []string {
	out := []string{}
	for _, l := range dedupe(labels) {
		if l != DimensionTime && l != DimensionEnvironment {
			out = append(out, l)
		}
	}
	return out
}

// check rejects a query the descriptor says the API would refuse.
func check(d *Dataset, q Query) error {
	g, err := ParseGranularity(string(q.Granularity))
	if err != nil {
		return fmt.Errorf("query %s: %w", q.Dataset, err)
	}
	if !d.Supports(g) {
		return fmt.Errorf("query %s: dataset does not offer granularity %s", q.Dataset, g)
	}
	dims := make([]string, 0, len(d.Dimensions))
	for _, dim := range d.Dimensions {
		dims = append(dims, dim.Name)
	}
	for _, l := range q.Labels {
		if !slices.Contains(dims, l) {
			return fmt.Errorf("query %s: unknown dimension %q", q.Dataset, l)
		}
	}
	metrics := d.MetricNames()
	for _, m := range q.Metrics {
		if !slices.Contains(metrics, m) {
			return fmt.Errorf("query %s: unknown metric %q", q.Dataset, m)
		}
	}
	if len(d.Filters) > 0 {
		for name := range q.Filters {
			if !slices.ContainsFunc(d.Filters, func(f Filter) bool { return f.Name == name }) {
				return fmt.Errorf("query %s: unknown filter %q", q.Dataset, name)
			}
		}
	}
	return nil
}

// runAll runs reqs with at most c.concurrency at a time, storing each one's
// rows and problems at its index. The first error cancels the rest; every
// goroutine has ended when it returns.
func (c *Client) runAll(ctx context.Context, reqs []Request, parts [][]Row, probs []Problems) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for range min(c.concurrency, len(reqs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				rows, p, err := c.Fetch(ctx, reqs[i])
				if err != nil {
					once.Do(func() { firstErr = err; cancel(err) })
					continue
				}
				parts[i], probs[i] = rows, p
			}
		}()
	}
	fed := 0
feed:
	for i := range reqs {
		select {
		case next <- i:
			fed++
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if fed < len(reqs) {
		return context.Cause(ctx)
	}
	return nil
}

// Fetch sends one planned request and decodes its rows. Values that are
// not values read NaN and malformed rows are left out; the Problems count
// both (see decodeRows). Only a failed request or an answer that cannot be
// parsed is an error.
func (c *Client) Fetch(ctx context.Context, r Request) ([]Row, Problems, error) {
	var resp dataResponse
	path := "/datasets/" + url.PathEscape(r.Dataset) + "/data"
	if err := c.api.Do(ctx, http.MethodPost, path, nil, r.Body(), &resp); err != nil {
		return nil, Problems{}, fmt.Errorf("query %s %s..%s (%d environments): %w",
			r.Dataset, r.Start.UTC().Format(wireTime), r.End.UTC().Format(wireTime), len(r.Environments), err)
	}
	rows, probs, err := decodeRows(&r, &resp)
	if err != nil {
		return nil, Problems{}, fmt.Errorf("query %s %s..%s: %w",
			r.Dataset, r.Start.UTC().Format(wireTime), r.End.UTC().Format(wireTime), err)
	}
	return rows, probs, nil
}
