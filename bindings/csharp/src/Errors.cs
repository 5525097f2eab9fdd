// Errors: every fallible C call returns a peft_error* that becomes a PeftException carrying the stable code.
using System;

namespace PeftC
{
    /// <summary>The stable error codes of peft_c (the PEFT_ERR_* values; never renumbered).</summary>
    public enum ErrorCode
    {
        Ok = 0,
        HeaderTooSmall = 1,
        HeaderTooLarge = 2,
        InvalidHeaderLength = 3,
        InvalidHeaderUtf8 = 4,
        InvalidHeader = 5,
        InvalidOffset = 6,
        ValidationOverflow = 7,
        MisalignedSlice = 8,
        TensorInvalidInfo = 9,
        MetadataIncompleteBuffer = 10,
        Io = 20,
        NotFound = 21,
        Unsupported = 22,
        UnresolvedKey = 23,
        ShapeMismatch = 24,
        InvalidArgument = 25,
        OutOfMemory = 26,
        Cancelled = 27,
        InvalidConfig = 28,
        InvalidCheckpoint = 29,
        OverBudget = 30,
        NonFinite = 31,
        Internal = 99,
    }

    /// <summary>An error reported by peft_c: the stable <see cref="Code"/> and a message naming what is wrong.</summary>
    [Serializable]
    public class PeftException : Exception
    {
        /// <summary>The stable code (also for codes newer than this binding: the enum then holds the raw number).</summary>
        public ErrorCode Code { get; private set; }

        /// <summary>The library's name of the code, e.g. "INVALID_OFFSET".</summary>
        public string CodeName { get { return Peft.ErrorCodeName(Code); } }

        public PeftException(ErrorCode code, string message) : base(message)
        {
            Code = code;
        }

        public PeftException(ErrorCode code, string message, Exception inner) : base(message, inner)
        {
            Code = code;
        }

        public override string ToString()
        {
            return "PeftException " + CodeName + ": " + base.ToString();
        }

        /// <summary>Throws the error the call returned, if any, and releases it either way.</summary>
        internal static void Check(ErrorHandle err)
        {
            Check(err, null);
        }

        /// <summary>As Check; an exception a callback raised during the call becomes the inner exception.</summary>
        internal static void Check(ErrorHandle err, Exception callbackException)
        {
            using (err)
            {
                if (err.IsInvalid)
                {
                    if (callbackException != null) throw callbackException;
                    return;
                }
                var code = (ErrorCode)Native.peft_error_code(err);
                string message = Utf8.Decode(Native.peft_error_message(err));
                if (callbackException != null) throw new PeftException(code, message, callbackException);
                throw new PeftException(code, message);
            }
        }
    }
}
