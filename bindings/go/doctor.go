package peft

/*
#include <stdlib.h>
#include <peft_c.h>
*/
import "C"

// AdapterDoctor checks the adapter folder adapterDir against the base model folder baseDir ("" for
// none) without merging, and without the strict loader (so it also reads adapters OpenAdapter
// refuses). It returns the report as JSON (schema 1, docs/doctor.md): summary.ok, problems (each with
// a stable kind), modules, renames, config_changes; decode it with encoding/json. Problems are in the
// report; errors (a missing folder, an unreadable config) are returned as error. Safe for concurrent
// use.
func AdapterDoctor(adapterDir, baseDir string) (string, error) {
	var cs cstrings
	defer cs.free()
	cadapter, err := cs.add(adapterDir, "adapter folder")
	if err != nil {
		return "", err
	}
	cbase, err := cs.addOptional(baseDir, "base folder")
	if err != nil {
		return "", err
	}
	var out *C.char
	if err := takeError(C.peft_adapter_doctor(cadapter, cbase, &out)); err != nil {
		return "", err
	}
	return takeString(out), nil
}

// AdapterDoctorFix writes outDir: adapterDir with every rename the doctor knows applied (atomically,
// as Adapter.Export writes a folder), and returns the report on adapterDir. Run AdapterDoctor on
// outDir to see what remains. Safe for concurrent use with distinct output folders.
func AdapterDoctorFix(adapterDir, baseDir, outDir string) (string, error) {
	var cs cstrings
	defer cs.free()
	cadapter, err := cs.add(adapterDir, "adapter folder")
	if err != nil {
		return "", err
	}
	cbase, err := cs.addOptional(baseDir, "base folder")
	if err != nil {
		return "", err
	}
	cout, err := cs.add(outDir, "output folder")
	if err != nil {
		return "", err
	}
	var out *C.char
	if err := takeError(C.peft_adapter_doctor_fix(cadapter, cbase, cout, &out)); err != nil {
		return "", err
	}
	return takeString(out), nil
}
