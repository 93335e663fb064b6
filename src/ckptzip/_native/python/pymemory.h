/* pymemory.h - registers the PageBuffer and Assembler types (pymemory.c) on the module. */
#ifndef CKZ_PYMEMORY_H
#define CKZ_PYMEMORY_H

#include <Python.h>

int ckz_add_memory_types(PyObject *module);

#endif /* CKZ_PYMEMORY_H */
