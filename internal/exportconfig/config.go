// Package exportconfig reads the exporter's configuration file
// (--config.file): what to export. Per dataset it keeps a subset of the
// dimensions (the Metrics API aggregates the others exactly), of the metrics
// (regular expressions on API names) and of the percentiles; globally it
// includes or excludes environments (by ID, name or property) and sets the
// metric-name prefix.
//
// A file is checked twice. Load checks what it can alone (keys, types,
// regular expressions, the prefix) and names the key of every problem.
// Select checks it against the dataset descriptors the platform lists at
// discovery (datasets, dimensions and percentiles that exist) and returns the
// descriptors as exported (metricsapi.Dataset.Select).
//
//	prefix: cdn
//	environments:
//	  include:
//	    - property: storefront|checkout
//	  exclude:
//	    - name: qa|sandbox
//	datasets:
//	  edge_usage_by_country:
//	    dimensions: []            # one series per environment
//	    metrics:
//	      exclude: [".*_prefetch_.*"]
//	    percentiles: [50, 95, 99]
package exportconfig

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/edgepipe/edgepipe/internal/platform"
)

// DefaultPrefix is the metric-name prefix when the file sets none:
// Prometheus names are cdn_<dataset>_<metric>, OTLP names cdn.<dataset>.<metric>.
const DefaultPrefix = "cdn"

// Config is a checked configuration file. The zero value is not valid; use
// Default, Load or Parse.
type Config struct {
	// Source names where the configuration came from (the file's path), for
	// messages.
	Source string
	// Prefix is the metric-name prefix.
	Prefix string
	// Include and Exclude choose the environments served: an environment is
	// served when it matches an Include selector (or Include is empty) and
	// no Exclude selector.
	Include, Exclude []Selector
	// Datasets are the per-dataset selections, in file order.
	Datasets []Dataset
}

// Selector matches environments. Every field set must match (fully, as
// an RE2 regular expression) for the selector to match.
type Selector struct {
	// Key is where the selector is in the file (environments.exclude[0]).
	Key string
	// ID matches the environment's ID, Name its name, Property its
	// property's ID or slug.
	ID, Name, Property *Pattern
}

// Pattern is an anchored regular expression with the text it came from.
type Pattern struct {
	Text string
	re   *regexp.Regexp
}

// MatchString reports whether the whole of s matches.
func (p *Pattern) MatchString(s string) bool { return p.re.MatchString(s) }

// Dataset is the selection of one dataset.
type Dataset struct {
	// Name is the dataset's name; Key is where it is in the file.
	Name, Key string
	// Dimensions are the label dimensions kept; nil keeps every one.
	Dimensions []string
	// MetricsInclude and MetricsExclude choose metrics by API name: a
	// metric is exported when it matches an include pattern (or there is
	// none) and no exclude pattern.
	MetricsInclude, MetricsExclude []*Pattern
	// Percentiles are the percentiles kept, nil keeps every one; metrics
	// that are not percentiles are not affected.
	Percentiles []float64
}

// Default returns the configuration without a file: everything exported,
// prefix DefaultPrefix.
func Default() *Config { return &Config{Source: "defaults", Prefix: DefaultPrefix} }

// Load reads and checks the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return Parse(b, path)
}

// Parse checks a configuration file's content; source names it in errors.
// Every problem found is reported, each with its key and line.
func Parse(data []byte, source string) (*Config, error) {
	c := &Config{Source: source, Prefix: DefaultPrefix}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("config file %s: %w", source, err)
	}
	p := &parser{}
	if len(root.Content) > 0 {
		p.top(root.Content[0], c)
	}
	if len(p.errs) > 0 {
		return nil, fmt.Errorf("config file %s: %w", source, errors.Join(p.errs...))
	}
	return c, nil
}

// parser walks the YAML tree and collects every problem.
type parser struct{ errs []error }

func (p *parser) fail(n *yaml.Node, key, format string, a ...any) {
	if key == "" {
		key = "the file"
	}
	p.errs = append(p.errs, fmt.Errorf("%s (line %d): %s", key, n.Line, fmt.Sprintf(format, a...)))
}

// mapping calls f for every key of a mapping node, failing on keys not in
// known.
func (p *parser) mapping(n *yaml.Node, key string, known []string, f func(k string, v *yaml.Node)) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.MappingNode {
		if known == nil {
			p.fail(n, key, "want a mapping")
		} else {
			p.fail(n, key, "want a mapping of %s", strings.Join(known, ", "))
		}
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		k := kn.Value
		sub := join(key, k)
		switch {
		case known != nil && !slices.Contains(known, k):
			p.fail(kn, sub, "unknown key (known here: %s)", strings.Join(known, ", "))
		case seen[k]:
			p.fail(kn, sub, "given twice")
		default:
			seen[k] = true
			f(k, vn)
		}
	}
}

func join(key, k string) string {
	if key == "" {
		return k
	}
	return key + "." + k
}

func (p *parser) top(n *yaml.Node, c *Config) {
	p.mapping(n, "", []string{"prefix", "environments", "datasets"}, func(k string, v *yaml.Node) {
		switch k {
		case "prefix":
			if s, ok := p.scalar(v, "prefix"); ok {
				if !validPrefix(s) {
					p.fail(v, "prefix", "%q is not a metric-name prefix: want letters, digits and underscores, not starting with a digit", s)
				} else {
					c.Prefix = s
				}
			}
		case "environments":
			p.mapping(v, "environments", []string{"include", "exclude"}, func(k string, v *yaml.Node) {
				sels := p.selectors(v, "environments."+k)
				if k == "include" {
					c.Include = sels
				} else {
					c.Exclude = sels
				}
			})
		case "datasets":
			p.mapping(v, "datasets", nil, func(name string, v *yaml.Node) {
				c.Datasets = append(c.Datasets, p.dataset(v, name))
			})
		}
	})
}

func validPrefix(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func (p *parser) scalar(n *yaml.Node, key string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.fail(n, key, "want a single value")
		return "", false
	}
	return n.Value, true
}

// list returns the items of a sequence node; a null is an empty list.
func (p *parser) list(n *yaml.Node, key string) ([]*yaml.Node, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, true
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, key, "want a list")
		return nil, false
	}
	return n.Content, true
}

func (p *parser) pattern(n *yaml.Node, key string) *Pattern {
	s, ok := p.scalar(n, key)
	if !ok {
		return nil
	}
	re, err := regexp.Compile("^(?:" + s + ")$")
	if err != nil {
		p.fail(n, key, "bad regular expression %q: %v", s, err)
		return nil
	}
	return &Pattern{Text: s, re: re}
}

func (p *parser) selectors(n *yaml.Node, key string) []Selector {
	items, ok := p.list(n, key)
	if !ok {
		return nil
	}
	var out []Selector
	for i, it := range items {
		sk := fmt.Sprintf("%s[%d]", key, i)
		s := Selector{Key: sk}
		p.mapping(it, sk, []string{"id", "name", "property"}, func(k string, v *yaml.Node) {
			pat := p.pattern(v, sk+"."+k)
			switch k {
			case "id":
				s.ID = pat
			case "name":
				s.Name = pat
			case "property":
				s.Property = pat
			}
		})
		if s.ID == nil && s.Name == nil && s.Property == nil {
			if it.Kind == yaml.MappingNode && len(it.Content) == 0 || it.Tag == "!!null" {
				p.fail(it, sk, "empty selector: give id, name and/or property")
			}
			continue
		}
		out = append(out, s)
	}
	return out
}

func (p *parser) dataset(n *yaml.Node, name string) Dataset {
	key := "datasets." + name
	d := Dataset{Name: name, Key: key}
	p.mapping(n, key, []string{"dimensions", "metrics", "percentiles"}, func(k string, v *yaml.Node) {
		switch k {
		case "dimensions":
			items, ok := p.list(v, key+".dimensions")
			if !ok {
				return
			}
			d.Dimensions = []string{}
			for i, it := range items {
				ik := fmt.Sprintf("%s.dimensions[%d]", key, i)
				if s, ok := p.scalar(it, ik); ok {
					if slices.Contains(d.Dimensions, s) {
						p.fail(it, ik, "dimension %q listed twice", s)
						continue
					}
					d.Dimensions = append(d.Dimensions, s)
				}
			}
		case "metrics":
			p.mapping(v, key+".metrics", []string{"include", "exclude"}, func(k string, v *yaml.Node) {
				lk := key + ".metrics." + k
				items, ok := p.list(v, lk)
				if !ok {
					return
				}
				if k == "include" && len(items) == 0 {
					p.fail(v, lk, "an empty include list selects no metric; leave it out to include every metric")
					return
				}
				var pats []*Pattern
				for i, it := range items {
					if pat := p.pattern(it, fmt.Sprintf("%s[%d]", lk, i)); pat != nil {
						pats = append(pats, pat)
					}
				}
				if k == "include" {
					d.MetricsInclude = pats
				} else {
					d.MetricsExclude = pats
				}
			})
		case "percentiles":
			items, ok := p.list(v, key+".percentiles")
			if !ok {
				return
			}
			d.Percentiles = []float64{}
			for i, it := range items {
				ik := fmt.Sprintf("%s.percentiles[%d]", key, i)
				s, ok := p.scalar(it, ik)
				if !ok {
					continue
				}
				f, err := strconv.ParseFloat(s, 64)
				if err != nil || !(f > 0 && f < 100) {
					p.fail(it, ik, "%q is not a percentile: want a number above 0 and below 100", s)
					continue
				}
				d.Percentiles = append(d.Percentiles, f)
			}
		}
	})
	return d
}

// FiltersEnvironments reports whether the configuration includes or
// excludes environments.
func (c *Config) FiltersEnvironments() bool { return len(c.Include) > 0 || len(c.Exclude) > 0 }

// Keep reports whether environment env of property prop is served. It
// implements schedule.EnvironmentFilter.
func (c *Config) Keep(env platform.Environment, prop platform.Property) bool {
	if len(c.Include) > 0 && !slices.ContainsFunc(c.Include, func(s Selector) bool { return s.Match(env, prop) }) {
		return false
	}
	return !slices.ContainsFunc(c.Exclude, func(s Selector) bool { return s.Match(env, prop) })
}

// Match reports whether env of property prop matches every field of s.
func (s Selector) Match(env platform.Environment, prop platform.Property) bool {
	if s.ID != nil && !s.ID.MatchString(env.ID) {
		return false
	}
	if s.Name != nil && !s.Name.MatchString(env.Name) {
		return false
	}
	if s.Property != nil {
		id := prop.ID
		if id == "" {
			id = env.PropertyID
		}
		if !s.Property.MatchString(id) && (prop.Slug == "" || !s.Property.MatchString(prop.Slug)) {
			return false
		}
	}
	return true
}
