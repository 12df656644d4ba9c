package preflight

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/prometheus/exporter-toolkit/web"
	"go.yaml.in/yaml/v3"
)

// CheckWebConfig is the name of the WebConfig check.
const CheckWebConfig = "web config file"

// WebConfig is the check "web config file": --web.config.file is valid as
// the web server reads it at start (exporter-toolkit's web.Validate: YAML,
// TLS files, basic auth users).
func WebConfig(path string) Check {
	return Check{Name: CheckWebConfig, Run: func(context.Context) Result {
		if err := web.Validate(path); err != nil {
			return Fail("%s: %v; the program would not start: fix the file (see exporter-toolkit's web configuration)", path, err)
		}
		c, err := readWebConfig(path)
		if err != nil {
			return Fail("%s: %v", path, err)
		}
		tlsState := "plain HTTP"
		if c.TLSConfig.IsEnabled() {
			tlsState = "TLS"
		}
		return Pass("%s: valid; the listener serves %s, %d basic auth user(s)", path, tlsState, len(c.Users))
	}}
}

// readWebConfig reads an exporter-toolkit web config file as the web
// server does: relative file names are relative to the file's directory.
func readWebConfig(path string) (*web.Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c web.Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	c.TLSConfig.SetDirectory(filepath.Dir(path))
	return &c, nil
}

// webConfigChain returns the certificate chain a web config file makes the
// listener serve, nil when the file is not given or configures no TLS.
func webConfigChain(path string) ([]*x509.Certificate, error) {
	if path == "" {
		return nil, nil
	}
	c, err := readWebConfig(path)
	if err != nil || !c.TLSConfig.IsEnabled() {
		return nil, err
	}
	tc, err := web.ConfigToTLSConfig(&c.TLSConfig)
	if err != nil {
		return nil, err
	}
	cert, err := tc.GetCertificate(nil)
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for _, der := range cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("its certificate: %w", err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, errors.New("it names no certificate")
	}
	return chain, nil
}

// Directory is the check name: the directory at path (given by flag) can
// be written by this user, or, when it does not exist yet, created in its
// nearest existing parent. It writes nothing.
func Directory(name, flag, path string) Check {
	return Check{Name: name, Run: func(context.Context) Result {
		abs, err := filepath.Abs(path)
		if err != nil {
			return Fail("%s %s: %v", flag, path, err)
		}
		dir, missing := abs, false
		for {
			fi, err := os.Stat(dir)
			if err == nil {
				if !fi.IsDir() {
					return Fail("%s %s: %s is not a directory", flag, path, dir)
				}
				break
			}
			if !errors.Is(err, os.ErrNotExist) || filepath.Dir(dir) == dir {
				return Fail("%s %s: %v", flag, path, err)
			}
			dir, missing = filepath.Dir(dir), true
		}
		if err := writable(dir); err != nil {
			return Fail("%s %s: %s is not writable by this user (%v): give the user write access, or point %s elsewhere (in a container, to a writable volume)", flag, path, dir, err, flag)
		}
		if missing {
			return Pass("%s does not exist yet; created at start in %s", abs, dir)
		}
		return Pass("%s is writable", abs)
	}}
}
