package cli

import (
	"fmt"
	"os"
	"strings"
)

// Secret is a credential. It never comes from a flag's value, which every
// user of the machine can read in the process list: it is read, in this
// order, from the file named by its --…-file flag, from the file named by
// $<ENV>_FILE, or from $<ENV>. A trailing newline of a file is dropped.
type Secret struct {
	env  string
	flag string // "" for an identity (a user name, a client ID) without a flag
	file string
}

// SecretFlag adds to fg the flag --<flag> naming a file that holds the
// secret, otherwise read from $<env>_FILE or $<env>. help starts the flag's
// help, e.g. "File holding the ClickHouse password."; where else the secret
// may come from is added.
func SecretFlag(fg FlagGroup, flag, env, help string) *Secret {
	s := &Secret{env: env, flag: flag}
	fg.Flag(flag, fmt.Sprintf("%s Instead of $%s, or the file named by $%s_FILE.", help, env, env)).
		PlaceHolder("FILE").SetValue(secretFile{s})
	return s
}

// secretFile is the value of a Secret's file flag: the file's path. Its
// type tells the command line's description (--help-json) which variable
// the secret comes from otherwise.
type secretFile struct{ s *Secret }

// Set sets the file's path.
func (f secretFile) Set(path string) error {
	f.s.file = path
	return nil
}

func (f secretFile) String() string { return f.s.file }

// EnvSecret is a credential that has no flag (a user name, a client ID):
// it comes from $<env>_FILE or $<env>.
func EnvSecret(env string) *Secret { return &Secret{env: env} }

// Read returns the secret ("" when it is not given, or s is nil). A file
// that cannot be read is an error naming the flag or variable, never the
// secret.
func (s *Secret) Read() (string, error) {
	if s == nil {
		return "", nil
	}
	if s.file != "" {
		return readSecretFile(s.file, "--"+s.flag)
	}
	if path := os.Getenv(s.env + "_FILE"); path != "" {
		return readSecretFile(path, s.env+"_FILE")
	}
	return os.Getenv(s.env), nil
}

func readSecretFile(path, from string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", from, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
