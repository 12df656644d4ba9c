// Command demoenvs prints the environment IDs of an organization, comma
// separated, using the platform API's accounts endpoints (spec 2.1 paging).
// scripts/demo.sh uses it to point the RTLD receiver at the simulator's
// environments; it needs nothing but Go.
//
//	EDGEPIPE_CLIENT_ID=… EDGEPIPE_CLIENT_SECRET=… demoenvs -url http://127.0.0.1:9790 -org ID [-max N]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:9790", "API base URL (also the auth URL)")
	org := flag.String("org", "", "organization ID")
	limit := flag.Int("max", 0, "print at most this many IDs (0: all)")
	flag.Parse()
	if err := run(*base, *org, *limit); err != nil {
		fmt.Fprintln(os.Stderr, "demoenvs:", err)
		os.Exit(1)
	}
}

// run prints the IDs of the environments of org (at most limit, 0: all),
// comma-separated.
func run(base, org string, limit int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := environments(ctx, base, org, os.Getenv("EDGEPIPE_CLIENT_ID"), os.Getenv("EDGEPIPE_CLIENT_SECRET"))
	if err != nil {
		return err
	}
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	_, err = fmt.Println(strings.Join(ids, ","))
	return err
}

type page struct {
	Items []struct {
		ID string `json:"id"`
	} `json:"items"`
	TotalItems int `json:"total_items"`
}

func environments(ctx context.Context, base, org, id, secret string) ([]string, error) {
	token, err := fetchToken(ctx, base, id, secret)
	if err != nil {
		return nil, err
	}
	props, err := list(ctx, base+"/accounts/v0.1/properties?organization_id="+url.QueryEscape(org), token)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, p := range props {
		envs, err := list(ctx, base+"/accounts/v0.1/environments?property_id="+url.QueryEscape(p), token)
		if err != nil {
			return nil, err
		}
		ids = append(ids, envs...)
	}
	return ids, nil
}

func fetchToken(ctx context.Context, base, id, secret string) (string, error) {
	form := url.Values{"grant_type": {"client_credentials"}, "scope": {"app.accounts"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/connect/token", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.SetBasicAuth(id, secret)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if err := do(req, &tok); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	return tok.AccessToken, nil
}

// list walks every page of a paginated list and returns the items' IDs.
func list(ctx context.Context, u, token string) ([]string, error) {
	var ids []string
	for pg := 0; ; pg++ { // pages count from 0 (spec 2.1)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s&page=%d&page_size=100", u, pg), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		var p page
		if err := do(req, &p); err != nil {
			return nil, err
		}
		for _, it := range p.Items {
			ids = append(ids, it.ID)
		}
		if len(p.Items) == 0 || len(ids) >= p.TotalItems {
			return ids, nil
		}
	}
}

func do(req *http.Request, v any) error {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s %s: decode: %w", req.Method, req.URL.Path, err)
	}
	return nil
}
