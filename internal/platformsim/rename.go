package platformsim

import (
	"errors"
	"fmt"
	"time"
)

// RenameEnvironment renames an environment, as the "Update environment"
// operation (spec 4.6, body `name`) does: its ID, property, domain names,
// traffic and certificates stay; the accounts API lists it under the new
// name from then on.
func (s *Server) RenameEnvironment(id, name string) (Environment, error) {
	if !envNameRe.MatchString(name) {
		return Environment{}, fmt.Errorf("platformsim: environment name %q may hold only lowercase letters, digits, dashes and underscores", name)
	}
	var env Environment
	err := s.changeWorld(func(w *world) error {
		i, ok := w.envByID[id]
		if !ok {
			return errors.New("platformsim: unknown environment " + id)
		}
		w.envs[i].Name = name
		w.envs[i].UpdatedAt = s.now().Truncate(time.Second)
		env = w.envs[i]
		return nil
	})
	return env, err
}
