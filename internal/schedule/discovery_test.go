package schedule

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/edgepipe/edgepipe/internal/platform"
)

func TestShardsAreDisjointAndCoverEverything(t *testing.T) {
	envs := make([]string, 1000)
	for i := range envs {
		envs[i] = fmt.Sprintf("%08x-1111-4222-8333-%012x", i*7919, i)
	}
	owner := make(map[string]int)
	sizes := make([]int, 3)
	for idx := range 3 {
		sh := Shard{Index: idx, Count: 3}
		if err := sh.Validate(); err != nil {
			t.Fatal(err)
		}
		for _, e := range envs {
			if sh.Owns(e) {
				if prev, ok := owner[e]; ok {
					t.Fatalf("%s owned by shards %d and %d", e, prev, idx)
				}
				owner[e] = idx
				sizes[idx]++
			}
		}
	}
	if len(owner) != len(envs) {
		t.Fatalf("%d of %d environments owned by some shard", len(owner), len(envs))
	}
	for i, n := range sizes {
		if n < 250 || n > 420 {
			t.Errorf("shard %d owns %d of 1000: badly balanced", i, n)
		}
	}
	// Deterministic: FNV-1a-64 of the ID, not of anything process-local.
	if got := ShardOf("a", 1<<30); got != int(0xaf63dc4c8601ec8c%(1<<30)) {
		t.Errorf("ShardOf(a) = %d, not FNV-1a-64 mod count", got)
	}
}

func TestShardValidate(t *testing.T) {
	for _, sh := range []Shard{{0, 0}, {-1, 2}, {2, 2}} {
		if sh.Validate() == nil {
			t.Errorf("%+v accepted", sh)
		}
	}
}

type fakeAccounts struct {
	props   map[string][]string
	envs    map[string][]string
	fail    string
	lookups int
}

func (f *fakeAccounts) Properties(_ context.Context, org string) ([]platform.Property, error) {
	if f.fail == org {
		return nil, errors.New("503")
	}
	var out []platform.Property
	for _, id := range f.props[org] {
		out = append(out, platform.Property{ID: id, OrganizationID: org, Slug: "slug-" + id})
	}
	return out, nil
}

func (f *fakeAccounts) Environments(_ context.Context, prop string) ([]platform.Environment, error) {
	if f.fail == prop {
		return nil, errors.New("503")
	}
	var out []platform.Environment
	for _, id := range f.envs[prop] {
		out = append(out, platform.Environment{ID: id, PropertyID: prop, Name: "name-" + id})
	}
	return out, nil
}

func (f *fakeAccounts) Environment(_ context.Context, id string) (*platform.Environment, error) {
	f.lookups++
	if f.fail == id {
		return nil, errors.New("404")
	}
	for prop, ids := range f.envs {
		if slices.Contains(ids, id) {
			return &platform.Environment{ID: id, PropertyID: prop, Name: "name-" + id}, nil
		}
	}
	return &platform.Environment{ID: id, PropertyID: "p-static", Name: "name-" + id}, nil
}

func (f *fakeAccounts) Property(_ context.Context, id string) (*platform.Property, error) {
	return &platform.Property{ID: id, Slug: "slug-" + id}, nil
}

// filterFunc is an EnvironmentFilter from a function.
type filterFunc func(platform.Environment, platform.Property) bool

func (f filterFunc) Keep(e platform.Environment, p platform.Property) bool { return f(e, p) }

func TestDiscovery(t *testing.T) {
	acc := &fakeAccounts{
		props: map[string][]string{"org1": {"p1", "p2"}, "org2": {"p3"}},
		envs:  map[string][]string{"p1": {"e1", "e2"}, "p2": {"e3"}, "p3": {"e4", "e1"}},
	}
	tests := []struct {
		name   string
		d      Discovery
		want   []string
		failOn string
	}{
		{"static only", Discovery{Static: []string{"s2", "s1", "s1"}}, []string{"s1", "s2"}, ""},
		{"organizations and static", Discovery{Accounts: acc, Organizations: []string{"org1", "org2"}, Static: []string{"e2", "s1"}},
			[]string{"e1", "e2", "e3", "e4", "s1"}, ""},
		{"property listing fails", Discovery{Accounts: acc, Organizations: []string{"org1"}}, nil, "p2"},
		{"organization listing fails", Discovery{Accounts: acc, Organizations: []string{"org2"}}, nil, "org2"},
		{"filter by name and property slug, static included", Discovery{Accounts: acc, Organizations: []string{"org1", "org2"}, Static: []string{"s1", "s2"},
			Filter: filterFunc(func(e platform.Environment, p platform.Property) bool {
				return e.Name != "name-e2" && p.Slug != "slug-p3" && e.Name != "name-s2"
			})}, []string{"e1", "e3", "s1"}, ""},
		{"static lookup fails with a filter", Discovery{Accounts: acc, Static: []string{"s1"},
			Filter: filterFunc(func(platform.Environment, platform.Property) bool { return true })}, nil, "s1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			acc.fail = tc.failOn
			got, err := tc.d.Environments(context.Background())
			if tc.failOn != "" {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	acc.fail = ""
	// Sharded discovery: the shards' results partition the whole.
	var union []string
	for i := range 3 {
		d := Discovery{Accounts: acc, Organizations: []string{"org1", "org2"}, Shard: Shard{Index: i, Count: 3}}
		got, err := d.Environments(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		union = append(union, got...)
	}
	slices.Sort(union)
	if !slices.Equal(union, []string{"e1", "e2", "e3", "e4"}) {
		t.Errorf("union of shards %v", union)
	}
	// A filtered static environment another shard owns is not looked up.
	statics := []string{"s1", "s2", "s3", "s4", "s5", "s6"}
	owned := 0
	sh := Shard{Index: 1, Count: 3}
	for _, id := range statics {
		if sh.Owns(id) {
			owned++
		}
	}
	acc.lookups = 0
	d := Discovery{Accounts: acc, Static: statics, Shard: sh,
		Filter: filterFunc(func(platform.Environment, platform.Property) bool { return true })}
	got, err := d.Environments(context.Background())
	if err != nil || len(got) != owned || acc.lookups != owned {
		t.Errorf("sharded static with filter: %v, %v, %d lookups; want %d of each", got, err, acc.lookups, owned)
	}
}

// catalogFunc is a Catalog from a function.
type catalogFunc func(served []string, described []platform.Environment, props map[string]platform.Property)

func (f catalogFunc) RecordDiscovery(served []string, described []platform.Environment, props map[string]platform.Property) {
	f(served, described, props)
}

// TestDiscoveryCatalog: the catalog learns the environments served and
// the descriptions discovery had: listed ones and filtered static ones
// with their properties, not static ones without a filter, nothing of
// environments another shard or the filter left out, and nothing of a
// failed discovery.
func TestDiscoveryCatalog(t *testing.T) {
	acc := &fakeAccounts{
		props: map[string][]string{"org1": {"p1", "p2"}},
		envs:  map[string][]string{"p1": {"e1", "e2"}, "p2": {"e3"}},
	}
	var calls int
	var served []string
	var described map[string]string // environment → property slug
	cat := catalogFunc(func(s []string, d []platform.Environment, props map[string]platform.Property) {
		calls++
		served, described = s, map[string]string{}
		for _, e := range d {
			described[e.ID] = e.Name + "@" + props[e.PropertyID].Slug
		}
	})
	d := Discovery{Accounts: acc, Organizations: []string{"org1"}, Static: []string{"s1"}, Catalog: cat,
		Filter: filterFunc(func(e platform.Environment, _ platform.Property) bool { return e.Name != "name-e2" })}
	if _, err := d.Environments(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"e1": "name-e1@slug-p1", "e3": "name-e3@slug-p2", "s1": "name-s1@slug-p-static"}
	if calls != 1 || !slices.Equal(served, []string{"e1", "e3", "s1"}) || fmt.Sprint(described) != fmt.Sprint(want) {
		t.Fatalf("catalog: %d calls, served %v, described %v; want %v", calls, served, described, want)
	}
	// Without a filter a static environment is served, not described.
	d.Filter = nil
	if _, err := d.Environments(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := described["s1"]; ok || !slices.Contains(served, "s1") || described["e2"] != "name-e2@slug-p1" {
		t.Fatalf("without a filter: served %v, described %v", served, described)
	}
	// A failed discovery tells the catalog nothing.
	acc.fail = "p2"
	if _, err := d.Environments(context.Background()); err == nil || calls != 2 {
		t.Fatalf("failed discovery: err %v, %d calls to the catalog, want 2", err, calls)
	}
}
