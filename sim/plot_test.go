package sim

import "errors"

func writePlots(dir string, ss []suite, all [][]outcome) error {
	return errors.New("sim: -plots is not implemented yet")
}
