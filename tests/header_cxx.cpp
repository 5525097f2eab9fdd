// The public header compiles as C++ (and twice: the include guard works).
#include "peft_c.h"
#include "peft_c.h"
